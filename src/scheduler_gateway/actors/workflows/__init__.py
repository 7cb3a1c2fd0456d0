"""Workflows (CONTRACT 2.12, docs/WORKFLOWS.md): ``WorkflowService`` (``service.py``) composes the parts, the
``WorkflowReleaser`` (``releaser.py``) turns the store's notices into releases, skips and finishes, and
``WorkflowGraph`` (``graph.py``) is the console's picture of one workflow."""

from .graph import WorkflowGraph
from .releaser import WorkflowReleaser
from .service import WorkflowService

__all__ = ["WorkflowGraph", "WorkflowReleaser", "WorkflowService"]
