"""nlevel: farm out independent tasks over MPI through a multi-level hierarchy.

```python
from nlevel import get_task_id
while (task_id := get_task_id(total, "run.h5", comm)) >= 0:
    do_job(task_id)
```
"""

__version__ = "0.1.0"

from .api import Farm, get_task_id  # noqa: E402
from .config import Config  # noqa: E402
from .errors import AppError, CheckpointError, ConfigError, NlevelError, PlanError  # noqa: E402
from .plan import Plan  # noqa: E402

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
    "__version__",
]
