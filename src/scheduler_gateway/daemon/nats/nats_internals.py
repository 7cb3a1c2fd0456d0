"""nats-py's private API, in one place: the only module of the package that touches another library's or
object's underscore names (``tests/unit/test_structure.py`` holds it to that).

Why at all: ``daemon/nats/publisher.py`` formats the ``HPUB`` command of its own publishes at once (about 1 us a
message, against 5 us through ``Client.publish``, which builds the header block with a regex, a strip and an
encode per header) and hands the bytes to the client's outgoing buffer. nats-py has no public call that takes a
command already formatted, so this module writes to the buffer the way ``Client.publish`` does, with the checks
``publish`` makes that concern a buffer, in its order.

On an upgrade of nats-py: ``has_buffer`` checks every name used here, so a client whose internals were renamed
or removed makes the publisher fall back to ``Client.publish`` (slower, never wrong); a name kept with another
meaning would not be seen, which ``tests/integration/test_publisher_wire.py`` guards (the bytes against
nats-py's own ``_send_publish``, a real server storing and acking what is sent through this buffer, a closed
client refusing as ``publish`` does). Checked against nats-py 2.16.
"""

from __future__ import annotations

from nats import errors
from nats.aio.client import Client

# Each private name of ``nats.aio.client.Client`` used below, and what it is:
# - ``_send_command(cmd)``: appends a protocol command to the pending buffer (and flushes once it is past the
#   client's flusher limit); ``publish`` ends with it. If it went, the publisher falls back to ``publish``.
# - ``_flush_queue`` / ``_flush_pending()``: the queue the flusher task waits on and the call that wakes it;
#   ``publish`` wakes the flusher when the queue is empty, so a lone message is not held until the next one.
# - ``_max_pending_size`` / ``_pending_data_size``: the buffer's limit while reconnecting and its fill;
#   ``publish`` refuses a message that would overflow it (OutboundBufferLimitError), and so does ``send``.
# - ``stats``: public, counted as ``publish`` counts (``out_msgs``, ``out_bytes``).
BUFFER_API = ("_send_command", "_flush_pending", "_flush_queue", "_max_pending_size", "_pending_data_size", "stats")


def has_buffer(nc: Client) -> bool:
    """Whether ``nc`` has every internal ``send`` uses (else the caller publishes through ``Client.publish``)."""
    return all(hasattr(nc, name) for name in BUFFER_API) and callable(getattr(nc, "_send_command", None))


async def send(nc: Client, command: bytes, payload_size: int) -> None:
    """Write one formatted ``PUB``/``HPUB`` ``command`` (whose payload is ``payload_size`` bytes) to ``nc``'s
    outgoing buffer, refusing it and counting it as ``Client.publish`` does. Only for a client that
    ``has_buffer``."""
    if nc.is_closed:
        raise errors.ConnectionClosedError
    if nc.is_draining_pubs:
        raise errors.ConnectionDrainingError
    if not nc.is_connected:
        limit = nc._max_pending_size
        if limit <= 0 or payload_size + nc._pending_data_size > limit:
            raise errors.OutboundBufferLimitError
    if payload_size > nc.max_payload:
        raise errors.MaxPayloadError
    nc.stats["out_msgs"] += 1
    nc.stats["out_bytes"] += payload_size
    await nc._send_command(command)
    queue = nc._flush_queue
    if queue is not None and queue.empty():
        await nc._flush_pending()
