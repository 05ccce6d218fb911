"""The faithful engine's validation and ffdl's policy on it: Pollux, Tiresias and Optimus on
Pollux's eight workloads per load against the results its simulator shipped, and ffdl's
policy (the live autoscaler's path) against Pollux's. Arguments as
``python -m ffdl.sim.faithful`` (``--policies``, ``--loads``, ``--workloads``,
``--processes``); Pollux takes minutes per workload, the others seconds.
"""

from __future__ import annotations

import sys

from ffdl.sim.faithful.validate import main

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
