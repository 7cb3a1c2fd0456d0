"""One validation of a kind's settings for every way in (docs/FLOW.md; issue 49 point 4): the bound check
(``model/kind_limits.py``) refuses what would not store or decode, in the kind service (the API's, the console's
and gatewayctl's way) and in the config's ``[kinds.<kind>]``; nothing is written on a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler_gateway.actors.kinds import KindService
from scheduler_gateway.actors.model.flow import Rate
from scheduler_gateway.actors.model.records import SYSTEM
from scheduler_gateway.daemon.config import ConfigError, load_config
from scheduler_gateway.wire.errors import Code, InvalidArgument
from tests.fakes.memory_store import MemoryStore

BAD = [
    ({"concurrency": 10**23}, "concurrency"),
    ({"concurrency": -1}, "concurrency"),
    ({"key_concurrency": 0}, "keyConcurrency"),
    ({"key_concurrency": 1_000_001}, "keyConcurrency"),
    ({"rate": Rate(limit=1, period_s=float("inf"))}, "rate.periodSeconds"),
    ({"rate": Rate(limit=1, period_s=float("nan"))}, "rate.periodSeconds"),
    ({"key_rate": Rate(limit=1, period_s=366 * 86400.0 + 1)}, "keyRate.periodSeconds"),
    ({"key_rate": Rate(limit=10**23, period_s=1.0)}, "keyRate.limit"),
    ({"paused": "yes"}, "paused"),
    ({"concurency": 1}, "concurency"),
]


@pytest.mark.parametrize(("changes", "field"), BAD, ids=[f for _, f in BAD])
async def test_the_kind_service_refuses_a_value_past_its_bound_and_writes_nothing(
    changes: dict[str, object], field: str
) -> None:
    store = MemoryStore()
    await store.start()
    svc = KindService(store.kinds, lambda s: None, lambda: 1.0)
    with pytest.raises(InvalidArgument) as info:
        await svc.update("echo", changes, SYSTEM, None)
    assert info.value.code == Code.INVALID_ARGUMENT and info.value.details == {"field": field}
    assert await store.kinds.read_kind("echo") is None and await store.tasks.outbox_batch(10) == []


async def test_the_bounds_themselves_are_taken() -> None:
    store = MemoryStore()
    await store.start()
    svc = KindService(store.kinds, lambda s: None, lambda: 1.0)
    top = {"concurrency": 1_000_000, "key_concurrency": 1, "rate": Rate(limit=1_000_000, period_s=366 * 86400.0)}
    s = await svc.update("echo", top, SYSTEM, None)
    assert (s.concurrency, s.key_concurrency, s.rate) == (1_000_000, 1, top["rate"])


@pytest.mark.parametrize(
    "toml",
    ["concurrency = 1000001", "key_rate_limit = 100000000000000000000000", "rate_limit = 1\nrate_period_s = 4e7\n"],
)
def test_the_config_refuses_a_kind_setting_past_its_bound(tmp_path: Path, toml: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(f"[kinds.echo]\n{toml}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert any(p.startswith("[kinds.echo]:") for p in info.value.problems), info.value.problems
