"""The task service's former home, kept so ``scheduler_gateway.actors.task_service`` still imports: the code is in
``actors/tasks/`` (``service.py`` the class, one module per group of operations); this re-exports its names."""

from .tasks import *  # noqa: F403 - the package's public names, listed once in its __all__
from .tasks import __all__ as __all__
