"""NATS subject names and JetStream stream / consumer names (docs/WIRE.md)."""

from __future__ import annotations

from dataclasses import dataclass

DISPATCH_STREAM = "GW_DISPATCH"
SETTLE_STREAM = "GW_SETTLE"
EVENTS_STREAM = "GW_EVENTS"
SETTLE_CONSUMER = "gw-settle"


#: The first token of every node inbox; the second is the node id.
NODE_INBOX_ROOT = "_GW_INBOX"


def kind_consumer(kind: str) -> str:
    return f"gw-kind-{kind}"


def consumer_name(kind: str) -> str:
    """``gw-kind-<kind>``, the durable pull consumer of a kind; a dot is not allowed in a consumer name, so it
    becomes ``_``."""
    return kind_consumer(kind).replace(".", "_")


def node_inbox_prefix(node_id: str) -> str:
    """``_GW_INBOX.<id>``: the inbox prefix a worker connects with (replies to it land below it)."""
    return f"{NODE_INBOX_ROOT}.{node_id}"


@dataclass(frozen=True, slots=True)
class Subjects:
    prefix: str = "gw"

    def dispatch(self, kind: str) -> str:
        return f"{self.prefix}.dispatch.{kind}"

    def dispatch_all(self) -> str:
        return f"{self.prefix}.dispatch.>"

    def claim(self, node_id: str) -> str:
        return f"{self.prefix}.claim.{node_id}"

    def heartbeat(self, node_id: str) -> str:
        return f"{self.prefix}.heartbeat.{node_id}"

    def settle(self, node_id: str) -> str:
        return f"{self.prefix}.settle.{node_id}"

    def cancel(self, node_id: str) -> str:
        return f"{self.prefix}.cancel.{node_id}"

    def artifact(self, node_id: str) -> str:
        """A node's artifact requests (begin, commit, abort: wire/artifacts.py)."""
        return f"{self.prefix}.artifact.{node_id}"

    def workflow(self, node_id: str) -> str:
        """A node's workflow requests (a handler's dependencies, its added tasks: wire/workflows.py)."""
        return f"{self.prefix}.workflow.{node_id}"

    def event(self, aggregate_type: str, event_type: str) -> str:
        return f"{self.prefix}.evt.{aggregate_type}.{event_type}"

    def wildcard(self, verb: str) -> str:
        """``gw.<verb>.*``: every node's subject of that verb."""
        return f"{self.prefix}.{verb}.*"

    def node_of(self, subject: str) -> str:
        """The node id of a ``gw.<verb>.<nodeId>`` subject."""
        return subject.rsplit(".", 1)[-1]
