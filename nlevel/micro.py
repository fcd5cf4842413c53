"""The built-in workload under the name runs record: its code is :mod:`nlevel.runtime.micro`.

``python -m nlevel.run`` with no APP loads the app ``nlevel.micro``; that name goes into
the checkpoint's fingerprint and the run report, so it stays the same across the move of
the code into :mod:`nlevel.runtime` (a run started before resumes after).
"""

from .runtime.micro import add_arguments, do_job, duration, fingerprint, setup, total

__all__ = ["add_arguments", "setup", "total", "fingerprint", "do_job", "duration"]
