"""nlevel: farm out independent tasks over MPI through a multi-level hierarchy.

```python
from nlevel import get_task_id
while (task_id := get_task_id(total, "run.h5", comm)) >= 0:
    do_job(task_id)
```
"""

from ._version import __version__
from .runtime.startwatch import mark as _mark

_mark("start")  # (for nlevel-mpiexec: this rank is an nlevel process, not yet known to be past MPI_Init)
from .api import Farm, get_task_id
from .config import Config
from .errors import AppError, CheckpointError, ConfigError, NlevelError, PlanError
from .model.plan import Plan
from .runtime.signals import install as install_signal_handler

__all__ = [
    "get_task_id",
    "Farm",
    "Config",
    "Plan",
    "NlevelError",
    "ConfigError",
    "PlanError",
    "CheckpointError",
    "AppError",
    "install_signal_handler",
    "__version__",
]
