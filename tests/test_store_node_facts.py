"""A node row keeps what its last heartbeat said of the node's process (host, pid, version; issue 53) in its
document, beside the drain columns, on every store: SQLite (in process and in the writer process), the in-memory
fake and PostgreSQL; a newer heartbeat without them (an older worker's) replaces them."""

from __future__ import annotations

from scheduler_gateway.actors.model.records import ActorRef, AuditEntry
from scheduler_gateway.actors.ports import NodeRecord
from scheduler_gateway.actors.store_ports import TaskStore
from tests.test_store_contract import T0, harness, store  # noqa: F401  (fixtures)


async def test_a_node_rows_process_facts_are_kept_and_follow_the_newest_heartbeat(store: TaskStore) -> None:  # noqa: F811
    rec = NodeRecord(
        id="n1", kinds=["echo"], capacity=3, running=2, active_leases=2, last_heartbeat_at=T0,
        host="worker-7.eu-central", pid=4242, version="1.4.0",
    )  # fmt: skip
    await store.nodes.put_nodes([rec])
    (got,) = [n for n in await store.nodes.list_nodes() if n.id == "n1"]
    assert (got.host, got.pid, got.version, got.active_leases, got.running) == (
        "worker-7.eu-central",
        4242,
        "1.4.0",
        2,
        2,
    )
    audit = AuditEntry(id="aud_1", at=T0, action="drain", object_type="node", object_id="n1", result="ok",
                       actor=ActorRef("user", "admin"))  # fmt: skip
    drained = await store.nodes.set_node_draining("n1", True, audit)
    assert drained is not None and drained.draining and drained.host == "worker-7.eu-central"
    older = NodeRecord(id="n1", kinds=["echo"], last_heartbeat_at=T0 - 1)
    await store.nodes.put_nodes([older])  # an older heartbeat does not replace the facts
    (got,) = [n for n in await store.nodes.list_nodes() if n.id == "n1"]
    assert got.pid == 4242 and got.draining
    newer = NodeRecord(id="n1", kinds=["echo"], last_heartbeat_at=T0 + 1)  # a worker that sends none
    await store.nodes.put_nodes([newer])
    (got,) = [n for n in await store.nodes.list_nodes() if n.id == "n1"]
    assert (got.host, got.pid, got.version) == (None, None, None) and got.draining
