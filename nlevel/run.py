"""``mpiexec -n N python -m nlevel.run [APP] [options]``: the command users know.

The code is :mod:`nlevel.runtime.cli`; this module only runs it.
"""

from .runtime.cli import build_parser, main

__all__ = ["main", "build_parser"]

if __name__ == "__main__":
    from .runtime.cli import _entry

    _entry()
