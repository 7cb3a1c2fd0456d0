"""The compose file's `ha` profile runs on a three-server NATS cluster with R3 streams (issue 22, point 5)."""

from __future__ import annotations

import tomllib

import yaml

from .helpers import OPS, REPO


def test_the_ha_profile_runs_three_nats_servers_and_every_gatewayd_uses_all_three() -> None:
    services = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]
    nats = {name for name in services if name.startswith("nats-") and name != "nats-certs"}
    assert nats == {"nats-1", "nats-2", "nats-3"}
    # in no profile: they run with and without `--profile ha`
    assert all(not services[n].get("profiles") for n in nats)
    gatewayds = [name for name in services if name.startswith("gatewayd")]
    assert set(gatewayds) == {"gatewayd", "gatewayd-2", "gatewayd-3"}
    for name in gatewayds:
        assert set(services[name]["depends_on"]) >= nats, name
        assert "/etc/gatewayd/gatewayd.toml" in " ".join(services[name]["command"]), name
    config = tomllib.loads((OPS / "gatewayd.toml").read_text())
    assert config["nats"]["stream_replicas"] == 3
    assert sorted(config["nats"]["url"].split(",")) == [f"tls://nats-{i}:4222" for i in (1, 2, 3)]
