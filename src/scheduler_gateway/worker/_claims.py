"""Claims made in the same turn of the event loop go out as one request.

A pull often delivers several offers at once; each offer's handler asks for its claim, and the claims asked for
before the loop comes round again are sent together as ``{claims: [...]}`` (at most ``MAX_BATCH_CLAIMS`` per
request) and answered in order by ``{results: [...]}``. A lone claim keeps the single form, which every
gateway understands. A request that gets no answer answers None to each of its claims (the offers are nak'd).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

import msgspec

from scheduler_gateway.wire.messages import MAX_BATCH_CLAIMS, ClaimBatch, ClaimBatchReply, ClaimReply, ClaimRequest

log = logging.getLogger("scheduler_gateway.worker")

Request = Callable[[bytes], Awaitable[bytes | None]]  # the claim subject's request/reply; None: no answer

_encode = msgspec.json.Encoder().encode
_decode_one = msgspec.json.Decoder(ClaimReply).decode
_decode_batch = msgspec.json.Decoder(ClaimBatchReply).decode


class ClaimBatcher:
    """``process_id`` goes with every request: the lease is granted to this process (docs/WIRE.md, Claim)."""

    def __init__(self, request: Request, process_id: str) -> None:
        self._request = request
        self._process_id = process_id
        self._pending: list[tuple[ClaimRequest, asyncio.Future[ClaimReply | None]]] = []
        self._flushing: set[asyncio.Task[None]] = set()
        self.requests = 0  # claim requests sent (for tests and logs)

    async def claim(self, req: ClaimRequest) -> ClaimReply | None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ClaimReply | None] = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)
        self._pending.append((req, fut))
        return await fut

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for start in range(0, len(pending), MAX_BATCH_CLAIMS):
            task = asyncio.create_task(self._send(pending[start : start + MAX_BATCH_CLAIMS]))
            self._flushing.add(task)
            task.add_done_callback(self._flushing.discard)

    async def _send(self, group: list[tuple[ClaimRequest, asyncio.Future[ClaimReply | None]]]) -> None:
        replies: list[ClaimReply | None] = [None] * len(group)
        try:
            self.requests += 1
            if len(group) == 1:
                one = group[0][0]
                raw = await self._request(_encode(msgspec.structs.replace(one, process_id=self._process_id)))
                replies = [None if raw is None else _decode_one(raw)]
            else:
                batch = ClaimBatch(claims=[req for req, _ in group], process_id=self._process_id)
                raw = await self._request(_encode(batch))
                if raw is not None:
                    results = _decode_batch(raw).results
                    if len(results) == len(group):
                        replies = list(results)
                    else:
                        log.error("a claim batch of %d got %d answers", len(group), len(results))
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.error("undecodable claim reply: %s", exc)
        finally:
            for (_, fut), reply in zip(group, replies, strict=True):
                if not fut.done():
                    fut.set_result(reply)

    async def close(self) -> None:
        for task in list(self._flushing):
            task.cancel()
        await asyncio.gather(*self._flushing, return_exceptions=True)
