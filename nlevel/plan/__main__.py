"""``python -m nlevel.plan``: see :mod:`nlevel.planner`."""

import sys

from ..planner import main

sys.exit(main())
