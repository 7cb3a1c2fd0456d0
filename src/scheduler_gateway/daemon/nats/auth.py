"""Who may do what on NATS: the per-node permissions of docs/WIRE.md, in one place.

A node user may only act as its own node. It may publish:

- its own requests and settles: ``<prefix>.claim.<id>``, ``<prefix>.heartbeat.<id>``,
  ``<prefix>.settle.<id>`` (the settle lands in ``GW_SETTLE``; JetStream's publish ack comes
  back on the node's inbox);
- the two JetStream API calls its pull consumers need, both on ``GW_DISPATCH`` only:
  ``$JS.API.CONSUMER.INFO.GW_DISPATCH.*`` (the worker waits until the gateway created the
  consumer) and ``$JS.API.CONSUMER.MSG.NEXT.GW_DISPATCH.*`` (its raw pull requests). A consumer
  name is one subject token and ``*`` matches whole tokens only, so the rule names the stream's
  consumers, all of which are the gateway's ``gw-kind-<kind>`` ones;
- the acks, naks and terms of offers: ``$JS.ACK.GW_DISPATCH.>``;
- its artifact requests ``<prefix>.artifact.<id>`` and the chunks of its uploads, on
  ``$O.GW_ARTIFACTS.C.<id>.>`` only (JetStream stores them in the bucket's stream; the publish ack comes back on
  its inbox). It cannot read the bucket (no consumer, no direct get), purge or delete in it, or write a meta;
- its workflow requests ``<prefix>.workflow.<id>`` (a running task's dependencies and the tasks it adds; the
  gateway also checks the task's lease is this node's).

It may subscribe to ``<prefix>.cancel.<id>`` and to its own inboxes ``_GW_INBOX.<id>.>``. The
worker connects with that inbox prefix (nats-py's ``inbox_prefix``), so the replies to its claims,
heartbeats, pull requests and settle publishes reach it while the replies meant for other nodes
and for the gateway (``_INBOX.>``, ``_GWACK.>``) stay out of its reach.

Everything else is denied, because an allow list denies what it does not name: a node cannot
publish on another node's subjects, create or delete streams or consumers, publish offers or
events, or read ``GW_SETTLE`` (neither a core subscription on ``<prefix>.settle.>`` nor any
JetStream API call on that stream).

The gateway user keeps full permissions: it is the trusted party that creates the streams and
consumers and answers every node; a rule list for it would restrict nobody but ourselves.

The embedded dev server (``embedded.py``) generates the same shape with the node id ``*``: one
``node`` user, as any node, for the workers of one developer's machine. ``ops/nats/nats-server.conf``
spells out the production shape, one user per node.
"""

from __future__ import annotations

from scheduler_gateway.daemon.nats.nats_server import NatsPermissions
from scheduler_gateway.wire.artifacts import node_chunk_subjects
from scheduler_gateway.wire.subjects import DISPATCH_STREAM, Subjects, node_inbox_prefix

__all__ = ["DEV_NODE_ID", "node_inbox_prefix", "node_permissions"]

#: The node id of the embedded dev server's one node user: any node (a whole-token wildcard).
DEV_NODE_ID = "*"


def node_permissions(node_id: str, subjects: Subjects = Subjects()) -> NatsPermissions:
    """What the NATS user of node ``node_id`` may do; ``DEV_NODE_ID`` gives the dev user (any node)."""
    return NatsPermissions(
        publish_allow=[
            subjects.claim(node_id),
            subjects.heartbeat(node_id),
            subjects.settle(node_id),
            f"$JS.API.CONSUMER.INFO.{DISPATCH_STREAM}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{DISPATCH_STREAM}.*",
            f"$JS.ACK.{DISPATCH_STREAM}.>",
            # artifacts (docs/WIRE.md, Artifacts): its requests, and chunks under its own node id only; it can
            # neither read, purge nor delete anything in the bucket, nor write an object's meta
            subjects.artifact(node_id),
            node_chunk_subjects(node_id),
            # workflows (docs/WIRE.md, Workflows): a running task's dependencies and added tasks, asked as itself
            subjects.workflow(node_id),
        ],
        subscribe_allow=[
            subjects.cancel(node_id),
            f"{node_inbox_prefix(node_id)}.>",
        ],
    )
