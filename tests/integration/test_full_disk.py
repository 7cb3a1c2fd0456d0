"""A full disk under the store (issue 22, point 3; CONTRACT 4, docs/OPERATIONS.md "The disk is full").

The gateway's data dir (its SQLite file) on a 24 MiB tmpfs filled by a ballast file, NATS elsewhere: creates answer
503 STORAGE_ERROR (never 500, never a 2xx for what did not commit), ``/readyz`` is 503 naming the store, settles
that arrive meanwhile wait in ``GW_SETTLE`` (redelivered until the store takes them), and once the ballast is gone
the same process takes writes again at once: every task that answered 201 exists, every settled task succeeded
exactly once. Needs root to mount the tmpfs (skipped with the reason elsewhere).
"""

from __future__ import annotations

import asyncio
import collections
import time
from pathlib import Path

from scheduler_gateway.actors.tasks import TaskPolicy
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from tests.e2e import invariants_api as inv
from tests.tmpfs import small_disk

from .harness import Api, HandNode, api_client, running_gateway


async def readyz(api: Api) -> tuple[int, dict[str, object]]:
    async with api.session.get(api.base + "/readyz") as resp:
        return resp.status, await resp.json()


async def test_a_full_disk_answers_503_keeps_settles_waiting_and_recovers_without_a_restart(
    tmp_path: Path, fresh_nats: NatsServerProcess
) -> None:
    with small_disk(tmp_path / "disk") as disk:
        policy = TaskPolicy(default_lease_s=120)  # the held settles must not lose their leases meanwhile
        async with running_gateway(disk.path / "gw", fresh_nats.url, policy=policy) as gw, api_client(gw) as api:
            node = await HandNode.connect(fresh_nats.url, "node-d")
            try:
                running = [(await api.create({"kind": "echo", "payload": i}))["id"] for i in range(5)]
                leases = {}
                for offer, msg in await node.pull("echo", 5):
                    await msg.ack()
                    reply = await node.claim(offer.task_id, offer.attempt_id)
                    assert reply.ok and reply.lease_id is not None, reply
                    leases[offer.task_id] = (offer.attempt_id, reply.lease_id)
                assert set(leases) == set(running)

                filled = disk.fill()
                statuses: collections.Counter[int] = collections.Counter()
                created: list[str] = []
                codes: set[str] = set()
                deadline = time.monotonic() + 0.5
                while time.monotonic() < deadline:
                    status, body, _ = await api.call("POST", "/api/tasks", {"kind": "echo", "payload": "full"})
                    statuses[status] += 1
                    if status == 201:
                        created.append(body["id"])  # committed after all (a reused WAL page): it must exist
                    else:
                        codes.add(body["error"]["code"])
                assert statuses[503] > 0 and set(statuses) <= {201, 503}, statuses
                assert codes == {"STORAGE_ERROR"}, codes
                status, ready = await readyz(api)
                assert status == 503 and ready["checks"]["store"]["ok"] is False, ready  # type: ignore[index]

                # settles while the disk is full: they wait in GW_SETTLE, the tasks stay running
                for tid, (attempt_id, lease_id) in leases.items():
                    await node.settle(tid, attempt_id, lease_id, result={"done": tid})
                await asyncio.sleep(0.5)
                held = [(await api.task(t))["state"] for t in running]

                disk.free()
                freed_at = time.monotonic()
                while True:
                    status, body, _ = await api.call("POST", "/api/tasks", {"kind": "echo", "payload": "after"})
                    if status == 201:
                        break
                    assert status == 503, (status, body)
                    await asyncio.sleep(0.05)
                recovered_s = time.monotonic() - freed_at
                created.append(body["id"])
                await inv.poll("readyz stays 503 after the disk was freed", _ready(api), timeout_s=5)
                for tid in running:
                    task = await api.wait_state(tid, {"succeeded"}, timeout_s=15)
                    assert task["result"] == {"done": tid}
                    await inv.check_task(api, tid, expected="succeeded")
                for tid in created:
                    assert (await api.task(tid))["id"] == tid
                print(
                    f"\ndisk full ({filled // 1024} KiB ballast): creates answered {dict(statuses)}; 5 settles held"
                    f" (states while full: {held}); writes again {recovered_s:.2f} s after the ballast went;"
                    f" lost 0, settled twice 0"
                )
            finally:
                await node.close()


def _ready(api: Api) -> object:
    async def check() -> bool:
        status, _ = await readyz(api)
        return status == 200

    return check
