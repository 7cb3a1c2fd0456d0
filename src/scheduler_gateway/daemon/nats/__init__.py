"""NATS: the bus (offers, cancels, claim and heartbeat responders, settles), the acked publisher, streams, node
permissions and the embedded nats-server."""
