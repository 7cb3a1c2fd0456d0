"""``python -m scheduler_gateway.worker``: the same as the ``gateway-worker`` console script."""

import sys

from ._cli import worker_main

sys.exit(worker_main())
