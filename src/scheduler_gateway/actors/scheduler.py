"""The scheduler's former home, kept so ``scheduler_gateway.actors.scheduler`` still imports: the code is in
``actors/scheduling/``; this re-exports its names."""

from .scheduling import *  # noqa: F403 - the package's public names, listed once in its __all__
from .scheduling import __all__ as __all__
