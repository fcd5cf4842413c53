"""``python -m nlevel.plan``, and ``from nlevel.plan import Plan``: kept where users know them.

The plan value lives in :mod:`nlevel.model.plan`, the command line in
:mod:`nlevel.runtime.plan_cli`; this module only points there.
"""

from .model.plan import SERVE_ONLY_CHOICES, Plan, default_regions

__all__ = ["Plan", "SERVE_ONLY_CHOICES", "default_regions"]

if __name__ == "__main__":
    import sys

    from .runtime.plan_cli import main

    sys.exit(main())
