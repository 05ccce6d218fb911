"""``python -m ffdl.sim.compare``: see ``ffdl.sim.compare.run``."""

from ffdl.sim.compare.run import main

raise SystemExit(main())
