"""``python -m nlevel.sim``: see :mod:`nlevel.sim.cli`."""

import gc
import sys

from .cli import main

status = main()
gc.freeze()  # (the process ends: its last collection would walk every simulated role again, 3 % of a big run)
sys.exit(status)
