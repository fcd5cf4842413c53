"""``python -m nlevel.status RUN.h5 [--json]``: how a run stands, read from outside without disturbing it.

The code is :mod:`nlevel.runtime.status`; this module only runs it.
"""

from .runtime.status import main

__all__ = ["main"]

if __name__ == "__main__":
    import sys

    sys.exit(main())
