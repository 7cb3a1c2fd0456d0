"""Which handler runs which kind: ``HandlerRegistry``, the ``@handler(kind)`` decorator and its
``default_registry``, and loading a handler module (``gateway-worker --handlers MODULE``)."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Mapping
from typing import Final

from scheduler_gateway.wire.messages import KIND_PATTERN, NODE_ID_PATTERN

from ._context import Handler

_NODE_ID_RE: Final = re.compile(NODE_ID_PATTERN)
_KIND_RE: Final = re.compile(KIND_PATTERN)


def _is_async_callable(fn: object) -> bool:
    if inspect.iscoroutinefunction(fn):  # also sees through functools.partial
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - an instance with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def validate_kind(kind: str) -> str:
    if not isinstance(kind, str) or not _KIND_RE.match(kind):
        raise ValueError(f"invalid kind {kind!r}: must match {KIND_PATTERN}")
    return kind


def validate_node_id(node_id: str) -> str:
    if not isinstance(node_id, str) or not _NODE_ID_RE.match(node_id):
        raise ValueError(f"invalid node id {node_id!r}: must match {NODE_ID_PATTERN}")
    return node_id


class HandlerRegistry:
    """kind -> async handler. Registering a kind twice with a different function is an error unless
    ``replace=True`` (so two modules cannot silently fight over a kind)."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, kind: str, fn: Handler, *, replace: bool = False) -> None:
        validate_kind(kind)
        if not _is_async_callable(fn):
            raise TypeError(f"handler for {kind!r} must be an async function (async def h(ctx, payload))")
        current = self._handlers.get(kind)
        if current is not None and current is not fn and not replace:
            raise ValueError(f"kind {kind!r} already has a handler ({_describe(current)})")
        self._handlers[kind] = fn

    def update(self, handlers: Mapping[str, Handler], *, replace: bool = False) -> None:
        for kind, fn in handlers.items():
            self.register(kind, fn, replace=replace)

    def get(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def items(self) -> list[tuple[str, Handler]]:
        return sorted(self._handlers.items())

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)


def _describe(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"


default_registry = HandlerRegistry()
"""Filled by the ``@handler(kind)`` decorator; ``gateway-worker --handlers MODULE`` reads it after the
import. The only module-level registry: tests and embedders build their own ``HandlerRegistry``."""


def handler(kind: str) -> Callable[[Handler], Handler]:
    """Decorator: ``@handler("resize")`` registers an ``async def h(ctx, payload)`` in ``default_registry``."""
    validate_kind(kind)

    def decorate(fn: Handler) -> Handler:
        default_registry.register(kind, fn)
        return fn

    return decorate


def load_handler_module(module_name: str, registry: HandlerRegistry, *, replace: bool = True) -> list[str]:
    """Import ``module_name`` and copy its handlers into ``registry``; returns the kinds it brought.

    A module either decorates its handlers with ``@handler(kind)`` (they land in ``default_registry``) or
    exposes ``HANDLERS: dict[str, handler]``; both are honoured. ``replace`` lets a module override a
    built-in demo kind.
    """
    module = importlib.import_module(module_name)
    # Everything decorated in this process so far: a module imported before (its decorators do not run
    # twice) still counts, and a handler package may spread its handlers over submodules.
    found: dict[str, Handler] = dict(default_registry.items())
    table = getattr(module, "HANDLERS", None)
    if table is not None:
        if not isinstance(table, Mapping):
            raise TypeError(f"{module_name}.HANDLERS must be a dict of kind -> async handler")
        found.update((str(kind), fn) for kind, fn in table.items())
    if not found:
        raise ValueError(f"module {module_name!r} registers no handler (use @handler(kind) or HANDLERS)")
    registry.update(found, replace=replace)
    return sorted(found)
