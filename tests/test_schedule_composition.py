"""Composition: ``[scheduler]`` reaches the scheduler as configured (docs/SCHEDULES.md, budget: production gets
the configured thresholds, never the model's permissive defaults), and the gateway wires the scheduler in
(routes, completion listener, thread check, readiness)."""

from __future__ import annotations

from pathlib import Path

from scheduler_gateway.actors.model.schedule import SchedulePolicy
from scheduler_gateway.actors.scheduling import SchedulerSettings
from scheduler_gateway.daemon.cli import settings_from_config
from scheduler_gateway.daemon.config import load_config
from scheduler_gateway.daemon.gateway import Gateway


def test_scheduler_config_reaches_the_policy_and_the_poller(tmp_path: Path) -> None:
    path = tmp_path / "gw.toml"
    path.write_text(
        f'data_dir = "{tmp_path}"\n'
        "[scheduler]\nmax_concurrent_runs = 3\nmin_once_delay_s = 0\npoll_interval_s = 0.25\nlease_s = 45\n"
    )
    settings = settings_from_config(load_config(path, {}), "nats://127.0.0.1:4222", None, None)
    assert settings.scheduler == SchedulerSettings(
        max_concurrent_runs=3, min_once_delay_s=0, poll_interval_s=0.25, lease_s=45
    )
    gw = Gateway(settings)
    assert gw.scheduling.service.policy == SchedulePolicy(min_once_delay_s=0, max_concurrent_runs=3, lease_s=45)
    assert gw.scheduling.actor._poll_s == 0.25
    assert gw.scheduling.actor.on_transition in gw.service.ledger.listeners
    assert gw.service._creation.thread_check is not None


def test_the_defaults_are_the_contracts_not_the_models(tmp_path: Path) -> None:
    settings = settings_from_config(load_config(None, {"GW_DATA_DIR": str(tmp_path)}), "nats://x:4222", None, None)
    policy = settings.scheduler.policy()
    assert policy == SchedulePolicy(min_once_delay_s=60, max_concurrent_runs=16, lease_s=60)
    assert policy != SchedulePolicy()
    assert settings.scheduler.poll_interval_s == 1.0
