"""``GatewayClient``: the admin API (docs/API.md) from asyncio, over one keep-alive aiohttp session.

Bodies are the wire types (``scheduler_gateway.wire.api`` and ``wire.schedule_api``); answers are decoded
into the wire views (``TaskView``, ``ScheduledTaskView``...). Refusals raise ``GatewayClientError``
subclasses carrying the stable code. Creates carry an ``Idempotency-Key`` (the caller's, else a fresh UUID of
version 7) and are retried with the same key on a lost connection or a 503; other writes are retried only
when that cannot do a change twice (see ``docs/CLIENT.md``, Retries).

The client is a facade: it makes (or is given) the ``Transport`` (``_transport``: base URL, token, session,
retries and delays), and its calls are those of its parts, each of which uses only the transport:
``TaskCalls`` (``_tasks``), ``ScheduleCalls`` (``_schedules``), ``OperationCalls`` (``_operations``),
``WorkflowCalls`` (``_workflows``).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType

import aiohttp

from ._artifacts import ArtifactStream
from ._batch import MAX_BATCH, MAX_BATCH_BYTES
from ._errors import GatewayClientError
from ._events import EventStream
from ._http import USER_AGENT, Body, Retry
from ._operations import OperationCalls
from ._schedules import ScheduleCalls
from ._tasks import TaskCalls
from ._transport import Transport
from ._workflows import WorkflowCalls


class GatewayClient(TaskCalls, ScheduleCalls, OperationCalls, WorkflowCalls):
    """The admin API over one keep-alive session. Use it as ``async with GatewayClient(url, token) as gw``
    (or call ``close()``); one client serves many concurrent calls. ``transport=`` gives the connection
    ready made (a ``MockTransport`` in tests) instead of the arguments that make one."""

    def __init__(
        self,
        base_url: str | None = None,
        token: str | None = None,
        *,
        timeout_s: float = 30.0,
        retries: int = 4,
        backoff_s: float = 0.2,
        backoff_max_s: float = 5.0,
        event_read_timeout_s: float = 45.0,
        session: aiohttp.ClientSession | None = None,
        headers: Mapping[str, str] | None = None,
        transport: Transport | None = None,
    ) -> None:
        if transport is None:
            if base_url is None:
                raise TypeError("GatewayClient needs a base_url (or a transport)")
            transport = Transport(
                base_url,
                token,
                timeout_s=timeout_s,
                retries=retries,
                backoff_s=backoff_s,
                backoff_max_s=backoff_max_s,
                event_read_timeout_s=event_read_timeout_s,
                session=session,
                headers=headers,
            )
        elif token is not None or session is not None or headers is not None:
            raise TypeError("with a transport, give the token, session and headers to the transport")
        elif base_url is not None and base_url.rstrip("/") != transport.base_url:
            raise ValueError(f"base_url {base_url!r} is not the transport's ({transport.base_url!r})")
        self.transport = transport

    @property
    def base_url(self) -> str:
        return self.transport.base_url

    @property
    def retries(self) -> int:
        return self.transport.retries

    # -- lifecycle -------------------------------------------------------------------------------------
    async def __aenter__(self) -> GatewayClient:
        self.transport.session()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session (when the client made it)."""
        await self.transport.aclose()


__all__ = [
    "MAX_BATCH",
    "MAX_BATCH_BYTES",
    "USER_AGENT",
    "ArtifactStream",
    "Body",
    "EventStream",
    "GatewayClient",
    "GatewayClientError",
    "Retry",
]
