"""``SyncGatewayClient``: the same API for code without an event loop. One private loop runs in a daemon
thread for the client's life; every call is a coroutine of a ``GatewayClient`` run there, and the calling
thread blocks on its result. Iterators (lists, events) pull one item at a time through the same loop."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Concatenate, ParamSpec, TypeVar

from ._client import EventStream, GatewayClient

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


def _blocking(
    fn: Callable[Concatenate[GatewayClient, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[SyncGatewayClient, P], R]:
    @functools.wraps(fn)
    def call(self: SyncGatewayClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._run(fn(self._client, *args, **kwargs))

    return call


def _iterating(
    fn: Callable[Concatenate[GatewayClient, P], AsyncIterator[T]],
) -> Callable[Concatenate[SyncGatewayClient, P], Iterator[T]]:
    @functools.wraps(fn)
    def call(self: SyncGatewayClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(fn(self._client, *args, **kwargs))

    return call


class SyncGatewayClient:
    """A blocking ``GatewayClient``: the same methods with the same arguments, without ``await``; lists and
    ``events()`` are plain iterators. Use it as a context manager (or call ``close()``). Safe to call from
    several threads: the calls run concurrently on the client's loop."""

    def __init__(self, base_url: str | None = None, token: str | None = None, **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gateway-client", daemon=True)
        self._thread.start()
        self._closed = False

        async def make() -> GatewayClient:
            return GatewayClient(base_url, token, **options)

        self._client = self._run(make())

    @property
    def client(self) -> GatewayClient:
        """The ``GatewayClient`` underneath (its coroutines must run on this client's loop)."""
        return self._client

    def _run(self, coro: Coroutine[Any, Any, R]) -> R:
        if self._closed:
            coro.close()
            raise RuntimeError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, it: AsyncIterator[T]) -> Iterator[T]:
        async def step() -> tuple[bool, T | None]:
            try:
                return True, await it.__anext__()
            except StopAsyncIteration:
                return False, None

        async def close() -> None:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                await aclose()

        try:
            while True:
                more, item = self._run(step())
                if not more:
                    return
                yield item  # type: ignore[misc]
        finally:
            if not self._closed:
                self._run(close())

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._client.close())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> SyncGatewayClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # tasks
    task_body = staticmethod(GatewayClient.task_body)
    submit = _blocking(GatewayClient.submit)
    submit_many = _blocking(GatewayClient.submit_many)
    get = _blocking(GatewayClient.get)
    list_tasks = _iterating(GatewayClient.list_tasks)
    history = _iterating(GatewayClient.history)
    cancel = _blocking(GatewayClient.cancel)
    approve = _blocking(GatewayClient.approve)
    amend = _blocking(GatewayClient.amend)
    retry = _blocking(GatewayClient.retry)
    rework = _blocking(GatewayClient.rework)
    wait = _blocking(GatewayClient.wait)

    def events(
        self, *, types: list[str] | None = None, aggregate_id: str | None = None, last_event_id: int | None = None
    ) -> Iterator[Any]:
        """``Event`` and ``Gap`` items, reconnecting by itself (close the iterator, or break, to stop)."""
        stream: EventStream = self._client.events(types=types, aggregate_id=aggregate_id, last_event_id=last_event_id)
        return self._iterate(stream)

    # workflows
    workflow_task = staticmethod(GatewayClient.workflow_task)
    submit_workflow = _blocking(GatewayClient.submit_workflow)
    submit_workflow_body = _blocking(GatewayClient.submit_workflow_body)
    get_workflow = _blocking(GatewayClient.get_workflow)
    list_workflows = _iterating(GatewayClient.list_workflows)
    cancel_workflow = _blocking(GatewayClient.cancel_workflow)
    retry_workflow = _blocking(GatewayClient.retry_workflow)
    wait_workflow = _blocking(GatewayClient.wait_workflow)

    # dead letters, audit, nodes, health
    dead_letters = _iterating(GatewayClient.dead_letters)
    get_dead_letter = _blocking(GatewayClient.get_dead_letter)
    redrive = _blocking(GatewayClient.redrive)
    callback_dead_letters = _iterating(GatewayClient.callback_dead_letters)
    get_callback_dead_letter = _blocking(GatewayClient.get_callback_dead_letter)
    redeliver = _blocking(GatewayClient.redeliver)
    audit = _iterating(GatewayClient.audit)
    nodes = _blocking(GatewayClient.nodes)
    drain = _blocking(GatewayClient.drain)
    health = _blocking(GatewayClient.health)
    ready = _blocking(GatewayClient.ready)

    # kinds and artifacts
    kinds = _blocking(GatewayClient.kinds)
    get_kind = _blocking(GatewayClient.get_kind)
    set_kind = _blocking(GatewayClient.set_kind)
    pause_kind = _blocking(GatewayClient.pause_kind)
    resume_kind = _blocking(GatewayClient.resume_kind)
    artifacts = _iterating(GatewayClient.artifacts)
    list_artifacts = _blocking(GatewayClient.list_artifacts)
    download_artifact = _blocking(GatewayClient.download_artifact)

    def open_artifact(
        self, task_id: str, name: str, *, start: int = 0, end: int | None = None, chunk_bytes: int = 1 << 20
    ) -> Iterator[bytes]:
        """The artifact's bytes as a plain iterator of chunks (a refusal raises at the first ``next``); close
        the iterator, or run it to its end, to release the connection."""
        return self._iterate(self._client.open_artifact(task_id, name, start=start, end=end, chunk_bytes=chunk_bytes))

    # threads
    create_thread = _blocking(GatewayClient.create_thread)
    get_thread = _blocking(GatewayClient.get_thread)
    list_threads = _iterating(GatewayClient.list_threads)
    delete_thread = _blocking(GatewayClient.delete_thread)
    thread_schedules = _iterating(GatewayClient.thread_schedules)

    # scheduled tasks
    create_schedule = _blocking(GatewayClient.create_schedule)
    get_schedule = _blocking(GatewayClient.get_schedule)
    list_schedules = _iterating(GatewayClient.list_schedules)
    update_schedule = _blocking(GatewayClient.update_schedule)
    pause_schedule = _blocking(GatewayClient.pause_schedule)
    resume_schedule = _blocking(GatewayClient.resume_schedule)
    trigger_schedule = _blocking(GatewayClient.trigger_schedule)
    delete_schedule = _blocking(GatewayClient.delete_schedule)
    schedule_runs = _iterating(GatewayClient.schedule_runs)
    upcoming = _blocking(GatewayClient.upcoming)


__all__ = ["SyncGatewayClient"]
