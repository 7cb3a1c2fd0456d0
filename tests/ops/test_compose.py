"""docker compose (issue 6): ``docker-compose.yml`` validates against the Compose specification's JSON
schema, and what it wires together exists: the files it mounts, the NATS users its workers log in as,
the production config gatewayd loads, the healthchecks. No Docker engine runs here, so the images are
not built; the Dockerfile is checked for the files it copies."""

from __future__ import annotations

import copy
import json
import re
from importlib.resources import files
from typing import Any

import jsonschema
import pytest
import yaml

from scheduler_gateway.daemon.config import load_config, production_problems

from .helpers import NATS_CONF, OPS, REPO

COMPOSE = REPO / "docker-compose.yml"


def compose_schema() -> dict[str, Any]:
    # The Compose specification's schema (compose-spec/compose-spec, schema/compose-spec.json), as
    # vendored and kept up to date by the check-jsonschema package (pinned in constraints.txt).
    text = files("check_jsonschema.builtin_schemas.vendor").joinpath("compose-spec.json").read_text()
    schema: dict[str, Any] = json.loads(text)
    return schema


def compose_errors(doc: Any) -> list[str]:
    schema = compose_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return doc


def test_compose_file_validates_against_the_compose_specification(compose: dict[str, Any]) -> None:
    assert compose_schema()["title"] == "Compose Specification"
    assert compose_errors(compose) == []


@pytest.mark.parametrize(
    ("where", "change"),
    [
        ("a misspelt service key", lambda d: d["services"]["gatewayd"].update(healtcheck={})),
        ("a healthcheck of the wrong type", lambda d: d["services"]["gatewayd"].update(healthcheck="curl")),
        ("an unknown top-level key", lambda d: d.update(service={})),
        ("ports that are not a list", lambda d: d["services"]["gatewayd"].update(ports="8080:8080")),
    ],
)
def test_the_validation_is_not_vacuous(compose: dict[str, Any], where: str, change: Any) -> None:
    broken = copy.deepcopy(compose)
    change(broken)
    assert compose_errors(broken), where


def test_the_services_the_issue_asks_for(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {"nats-1", "nats-2", "nats-3", "gatewayd", "worker-1", "worker-2", "prometheus"} <= set(services)
    gatewayd = services["gatewayd"]
    assert "/readyz" in " ".join(gatewayd["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/gatewayd") for v in gatewayd["volumes"])
    for name in ("nats-1", "nats-2", "nats-3"):
        assert f"{name}:/var/lib/nats" in services[name]["volumes"]
        assert services[name]["environment"]["NATS_SERVER_NAME"] == name
        assert "healthcheck" in services[name]
    for name in ("worker-1", "worker-2", "prometheus"):
        assert services[name]["depends_on"]["gatewayd"]["condition"] == "service_healthy"
    assert set(compose["volumes"]) >= {"gatewayd-data", "nats-1", "nats-2", "nats-3", "prometheus-data"}


def test_every_mounted_file_exists(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (REPO / source).exists(), f"{name} mounts {source}, which is not in the repository"


def test_prometheus_gets_the_config_and_the_rules(compose: dict[str, Any]) -> None:
    prometheus = compose["services"]["prometheus"]
    assert "./ops/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    config = yaml.safe_load((OPS / "prometheus" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["alerts.yml"]
    targets = [t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert "gatewayd:8080" in targets


def _flag(command: list[str], name: str) -> str:
    return next(arg.split("=", 1)[1] for arg in command if arg.startswith(f"--{name}="))


def test_workers_log_in_as_their_own_node_users(compose: dict[str, Any]) -> None:
    conf = NATS_CONF.read_text()
    conf_vars = set(re.findall(r"\$(GW_[A-Z0-9_]+)", conf))
    for name in ("worker-1", "worker-2"):
        worker = compose["services"][name]
        node_id = _flag(worker["command"], "node-id")
        assert _flag(worker["command"], "user") == node_id
        assert f'user: "{node_id}"' in conf, f"no NATS user for {node_id} in {NATS_CONF.name}"
        # the password the worker sends is the variable the server checks for that user
        password_var = re.search(r"\$\{(\w+):", worker["environment"]["GW_NATS_PASSWORD"])
        assert password_var is not None
        user_block = conf[conf.index(f'user: "{node_id}"') :]
        assert user_block.split("password: $", 1)[1].split()[0] == password_var.group(1)
        assert "--password" not in " ".join(worker["command"])
    for name in ("nats-1", "nats-2", "nats-3"):
        environment = compose["services"][name]["environment"]
        assert conf_vars <= set(environment), "a server lacks a password variable"
        for var in conf_vars:  # quoted: nats-server parses the value as config (see nats-server.conf)
            assert environment[var].startswith(f'"${{{var}:?') and environment[var].endswith('}"'), var
    gateway_password = compose["services"]["gatewayd"]["environment"]["GW_NATS_PASSWORD"]
    assert gateway_password.startswith("${GW_NATS_GATEWAY_PASSWORD:?")
    env_example = (REPO / ".env.example").read_text()
    assert all(f"{var}=" in env_example for var in conf_vars)


def test_the_production_config_loads_and_passes_the_production_rules(compose: dict[str, Any]) -> None:
    gatewayd = compose["services"]["gatewayd"]
    assert "./ops/gatewayd.toml:/etc/gatewayd/gatewayd.toml:ro" in gatewayd["volumes"]
    config = load_config(OPS / "gatewayd.toml", {"GW_NATS_PASSWORD": "x" * 32})
    assert config.mode == "production" and config.nats.stream_replicas == 3
    assert config.nats.servers == ["tls://nats-1:4222", "tls://nats-2:4222", "tls://nats-3:4222"]
    assert production_problems(config) == []
    assert str(config.data_dir) == "/var/lib/gatewayd"


def test_the_dockerfile_copies_what_exists() -> None:
    text = (REPO / "Dockerfile").read_text()
    sources = [
        src for line in text.splitlines() if line.startswith("COPY ") for src in line.split()[1:-1] if src != "--chown"
    ]
    assert sources, "no COPY in the Dockerfile"
    for src in sources:
        assert (REPO / src).exists(), src
    assert "USER gateway" in text


def test_the_ha_profile_runs_three_gatewayd_on_one_postgresql(compose: dict[str, Any]) -> None:
    services = compose["services"]
    ha = {name for name, s in services.items() if "ha" in s.get("profiles", [])}
    assert ha == {"postgres", "gatewayd-2", "gatewayd-3"}
    urls = {services[n]["environment"]["GW_STORE_URL"] for n in ("gatewayd-2", "gatewayd-3")}
    assert (
        len(urls) == 1
        and next(iter(urls)).startswith("postgresql://gateway:")
        and "@postgres:5432/" in next(iter(urls))
    )
    ids = {services[n]["environment"]["GW_INSTANCE_ID"] for n in ("gatewayd", "gatewayd-2", "gatewayd-3")}
    assert ids == {"gatewayd-1", "gatewayd-2", "gatewayd-3"}  # distinct [instance] ids
    for name in ("gatewayd-2", "gatewayd-3"):
        assert services[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert "/readyz" in " ".join(services[name]["healthcheck"]["test"])
    # without the profile, gatewayd keeps its SQLite file
    default = services["gatewayd"]["environment"]["GW_STORE_URL"]
    assert default == "${GW_STORE_URL:-sqlite:////var/lib/gatewayd/gateway.db}"
    config = load_config(OPS / "gatewayd.toml", {"GW_NATS_PASSWORD": "x" * 32, "GW_STORE_URL": default[16:-1]})
    assert config.store_location.kind == "sqlite" and str(config.store_path) == "/var/lib/gatewayd/gateway.db"
