"""``python -m ffdl.sim.faithful``: see ``validate``."""

from ffdl.sim.faithful.validate import main

raise SystemExit(main())
