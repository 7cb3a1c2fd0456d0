"""The gateway as one list of services (daemon/lifecycle.py): composed in recovery order, the same list alone on
SQLite and as one of several on PostgreSQL (the duty group decides what runs where); a start that fails at the
last step (the HTTP port taken) stops everything it had started before the error reaches the caller."""

from __future__ import annotations

import socket
from pathlib import Path

import msgspec
import pytest

from scheduler_gateway.daemon.duty_group import DirectDuties
from scheduler_gateway.daemon.gateway import Gateway
from scheduler_gateway.daemon.ha import HighAvailability
from scheduler_gateway.daemon.nats.nats_server import NatsServerProcess
from scheduler_gateway.wire.errors import GatewayError

from .harness import running_gateway, settings

RECOVERY_ORDER = [
    "data dir",
    "store",
    "token cache",
    "nats",
    "node registry",
    "instance",
    "kinds",
    "task service",
    "dispatcher",
    "workflows",
    "callback client",
    "scheduler",
    "duties",
    "artifacts",
    "workflow requests",
    "node inputs",
    "http",
]


def test_one_list_of_services_in_recovery_order_alone_or_among_several(tmp_path: Path) -> None:
    alone = Gateway(settings(tmp_path / "a", "nats://127.0.0.1:4222"))
    several = Gateway(
        settings(tmp_path / "b", "nats://127.0.0.1:4222", store_url="postgresql://gw@127.0.0.1:1/gw", instance_id="i")
    )
    assert [s.name for s in alone.services.steps] == RECOVERY_ORDER
    assert [s.name for s in several.services.steps] == RECOVERY_ORDER
    assert isinstance(alone.duties, DirectDuties) and isinstance(several.duties, HighAvailability)
    # the same duties, by name, in the same start order
    assert list(alone.duties.duties) == ["event-relay", "callback-sender", "dead-letter-keeper", "retention"]
    assert list(several.duties.duties)[2:] == list(alone.duties.duties)


async def test_a_start_that_fails_stops_what_it_started(tmp_path: Path, fresh_nats: NatsServerProcess) -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    gw = Gateway(msgspec.structs.replace(settings(tmp_path, fresh_nats.url), http_port=port))
    try:
        with pytest.raises(OSError, match="in use"):
            await gw.start()
        # every part that had started is stopped: the loops, the NATS connection, the store
        for actor in (
            gw.dispatcher,
            gw.relay,
            gw.callbacks,
            gw.dead_letter_keeper,
            gw.retention,
            gw.service.lease_clock,
        ):
            assert not actor.running, actor
        assert not gw.scheduling.actor.running
        assert not gw.bus.connected
        with pytest.raises(GatewayError):
            await gw.store.nodes.ping()
    finally:
        await gw.stop()
        taken.close()
    # nothing was left holding the data dir: the same gateway starts there now
    async with running_gateway(tmp_path, fresh_nats.url) as again:
        assert again.bus.connected
