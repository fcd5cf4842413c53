"""``python -m nlevel.sim``: see :mod:`nlevel.sim.cli`."""

import sys

from .cli import main

sys.exit(main())
