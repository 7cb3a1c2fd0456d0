"""Configuration (docs/CONFIG.md): defaults, TOML + environment precedence, validation, redaction,
production refusal of weak secrets, and the config lines of ``gatewayd check``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from scheduler_gateway.daemon.check import check_main
from scheduler_gateway.daemon.config import (
    Config,
    ConfigError,
    load_config,
    production_problems,
)
from scheduler_gateway.daemon.nats.nats_server import free_port

SECRET = "hunter2-Very-Secret-Value-42"


def write_toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return path


def problems_of(path: Path | None, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {})
    return info.value.problems


# --------------------------------------------------------------------------- defaults


def test_defaults_are_the_pinned_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    c = load_config(None, {})
    assert c.mode == "dev"
    assert c.data_dir == tmp_path / "var"
    assert (c.http.host, c.http.port) == ("127.0.0.1", 8080)
    assert c.nats.url is None and c.embedded_nats and c.nats.servers == []
    assert c.nats.embedded.port == 4222
    assert (c.nats.user, c.nats.password, c.nats.subject_prefix, c.nats.stream_replicas) == (None, None, "gw", 1)
    assert c.callbacks.secret is None
    assert c.callbacks.retry_delays_s == (1.0, 5.0, 30.0)
    assert c.callbacks.timeout_s == 5
    assert c.callbacks.allow_private_networks is True
    d = c.deadletter
    assert (d.max_dead_retries, d.auto_redrive, d.redrive_delay_s, d.archive_after_s, d.sweep_interval_s) == (
        3,
        True,
        300,
        604800,
        10,
    )
    assert c.dispatch.max_offers_per_kind == 64
    s = c.scheduler
    assert (s.max_concurrent_runs, s.min_once_delay_s, s.poll_interval_s, s.lease_s) == (16, 60, 1, 60)
    assert (c.events.max_age_s, c.events.max_msgs) == (604800, 10000)
    t = c.tasks
    assert (t.default_lease_s, t.default_timeout_s, t.default_max_attempts, t.max_payload_bytes) == (
        30,
        3600,
        3,
        1048576,
    )
    assert c.recovery.grace_s is None
    assert c.log.level == "INFO"
    assert c.source is None
    assert c.store_path == tmp_path / "var" / "gateway.db"


def test_production_denies_private_networks_unless_set(tmp_path: Path) -> None:
    assert load_config(None, {"GW_MODE": "production"}).callbacks.allow_private_networks is False
    path = write_toml(tmp_path, 'mode = "production"\n[callbacks]\nallow_private_networks = true\n')
    assert load_config(path, {}).callbacks.allow_private_networks is True
    path = write_toml(tmp_path, "[callbacks]\nallow_private_networks = false\n")
    assert load_config(path, {}).callbacks.allow_private_networks is False


def test_every_key_from_toml(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        f"""
mode = "production"
data_dir = "{tmp_path / "data"}"
[http]
host = "0.0.0.0"
port = 9000
[nats]
url = "nats://n1:4222, tls://n2:4223"
user = "gw"
password = "{SECRET}"
subject_prefix = "acme.gw"
stream_replicas = 3
[nats.embedded]
port = 4333
[callbacks]
secret = "{SECRET}"
retry_delays_s = [0.5, 2]
timeout_s = 2.5
allow_private_networks = true
[deadletter]
max_dead_retries = 0
auto_redrive = false
redrive_delay_s = 1
archive_after_s = 2
sweep_interval_s = 0.5
[dispatch]
max_offers_per_kind = 5
[scheduler]
max_concurrent_runs = 2
min_once_delay_s = 0
poll_interval_s = 0.25
lease_s = 20
[events]
max_age_s = 3600
max_msgs = 50
[tasks]
default_lease_s = 10
default_timeout_s = 60
default_max_attempts = 1
max_payload_bytes = 2048
[recovery]
grace_s = 15
[log]
level = "debug"
""",
    )
    c = load_config(path, {})
    assert c.source == path
    assert c.mode == "production" and c.data_dir == tmp_path / "data"
    assert (c.http.host, c.http.port) == ("0.0.0.0", 9000)
    assert c.nats.servers == ["nats://n1:4222", "tls://n2:4223"] and not c.embedded_nats
    assert (c.nats.user, c.nats.password, c.nats.subject_prefix) == ("gw", SECRET, "acme.gw")
    assert (c.nats.stream_replicas, c.nats.embedded.port) == (3, 4333)
    assert c.callbacks.secret == SECRET and c.callbacks.retry_delays_s == (0.5, 2.0)
    assert c.callbacks.timeout_s == 2.5 and c.callbacks.allow_private_networks is True
    assert c.deadletter.max_dead_retries == 0 and c.deadletter.auto_redrive is False
    assert (c.deadletter.redrive_delay_s, c.deadletter.archive_after_s, c.deadletter.sweep_interval_s) == (
        1,
        2,
        0.5,
    )
    assert c.dispatch.max_offers_per_kind == 5
    assert (c.scheduler.max_concurrent_runs, c.scheduler.poll_interval_s, c.scheduler.lease_s) == (2, 0.25, 20)
    assert (c.events.max_age_s, c.events.max_msgs) == (3600, 50)
    assert (c.tasks.default_lease_s, c.tasks.default_max_attempts, c.tasks.max_payload_bytes) == (10, 1, 2048)
    assert c.recovery.grace_s == 15
    assert c.log.level == "DEBUG"
    assert production_problems(c) == []


# --------------------------------------------------------------------------- precedence


ENV_CASES = [
    # variable, TOML text setting the key, value in TOML, value in env, attribute getter
    ("GW_MODE", 'mode = "dev"', "dev", "production", lambda c: c.mode),
    ("GW_DATA_DIR", 'data_dir = "/srv/a"', Path("/srv/a"), Path("/srv/b"), lambda c: c.data_dir),
    ("GW_HTTP_HOST", '[http]\nhost = "10.0.0.1"', "10.0.0.1", "10.0.0.2", lambda c: c.http.host),
    ("GW_HTTP_PORT", "[http]\nport = 9000", 9000, 9100, lambda c: c.http.port),
    ("GW_NATS_URL", '[nats]\nurl = "nats://a:4222"', "nats://a:4222", "nats://b:4222", lambda c: c.nats.url),
    ("GW_NATS_PORT", "[nats.embedded]\nport = 5000", 5000, 5001, lambda c: c.nats.embedded.port),
    ("GW_CALLBACK_SECRET", '[callbacks]\nsecret = "from-toml"', "from-toml", "from-env", lambda c: c.callbacks.secret),
    ("GW_LOG_LEVEL", '[log]\nlevel = "warning"', "WARNING", "ERROR", lambda c: c.log.level),
]


@pytest.mark.parametrize(("var", "toml", "in_toml", "in_env", "get"), ENV_CASES, ids=[c[0] for c in ENV_CASES])
def test_env_overrides_toml(
    tmp_path: Path, var: str, toml: str, in_toml: object, in_env: object, get: Callable[[Config], object]
) -> None:
    path = write_toml(tmp_path, toml + "\n")
    assert get(load_config(path, {})) == in_toml
    assert get(load_config(path, {var: str(in_env)})) == in_env
    # and without a file the variable alone sets it
    assert get(load_config(None, {var: str(in_env)})) == in_env


def test_nats_user_and_password_from_env(tmp_path: Path) -> None:
    c = load_config(None, {"GW_NATS_URL": "nats://h:4222", "GW_NATS_USER": "u", "GW_NATS_PASSWORD": SECRET})
    assert (c.nats.user, c.nats.password) == ("u", SECRET)


def test_unrelated_env_is_ignored() -> None:
    c = load_config(None, {"GW_UNKNOWN": "x", "HOME": "/root", "PORT": "1"})
    assert c == load_config(None, {})


def test_empty_env_counts_as_unset_except_for_secrets(tmp_path: Path) -> None:
    path = write_toml(tmp_path, '[http]\nport = 9000\n[nats]\nurl = "nats://a:4222"\n')
    c = load_config(path, {"GW_HTTP_PORT": "", "GW_NATS_URL": ""})
    assert c.http.port == 9000 and c.nats.url == "nats://a:4222"
    # an empty secret is a secret given empty: production must see it
    c = load_config(None, {"GW_CALLBACK_SECRET": ""})
    assert c.callbacks.secret == ""
    assert production_problems(c) == ["callbacks.secret is empty"]


def test_relative_data_dir_is_resolved_against_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert load_config(None, {"GW_DATA_DIR": "state/gw"}).data_dir == tmp_path / "state" / "gw"


def test_env_numbers_are_parsed_and_zero_means_a_free_port() -> None:
    assert load_config(None, {"GW_HTTP_PORT": " 0 "}).http.port == 0
    assert load_config(None, {"GW_NATS_PORT": "0"}).nats.embedded.port == 0


# --------------------------------------------------------------------------- validation


BAD = [
    # TOML text, env, a fragment the message must contain
    ("[bogus]\nx = 1\n", {}, "unknown section [bogus]"),
    ("colour = 1\n", {}, "unknown key colour"),
    ("[http]\nhots = 'a'\n", {}, "unknown key http.hots"),
    ("[nats.embedded]\nprot = 1\n", {}, "unknown key nats.embedded.prot"),
    ("[nats.other]\nx = 1\n", {}, "unknown section [nats.other]"),
    ("http = 5\n", {}, "[http] must be a table, not an integer"),
    ('mode = "prod"\n', {}, "mode must be one of dev, production"),
    ("", {"GW_MODE": "staging"}, "mode (GW_MODE) must be one of dev, production"),
    ('data_dir = ""\n', {}, "data_dir must not be empty"),
    ("data_dir = 3\n", {}, "data_dir must be a string, not an integer"),
    ("[http]\nport = 70000\n", {}, "http.port must be 0..65535"),
    ("[http]\nport = -1\n", {}, "http.port must be 0..65535"),
    ('[http]\nport = "80"\n', {}, "http.port must be an integer, not a string"),
    ("[http]\nport = 80.5\n", {}, "http.port must be an integer, not a float"),
    ("[http]\nport = true\n", {}, "http.port must be an integer, not a boolean"),
    ("", {"GW_HTTP_PORT": "eighty"}, "http.port (GW_HTTP_PORT) must be an integer"),
    ("", {"GW_NATS_PORT": "99999"}, "nats.embedded.port (GW_NATS_PORT) must be 0..65535"),
    ('[http]\nhost = ""\n', {}, "http.host must not be empty"),
    ('[nats]\nurl = "http://h:4222"\n', {}, "nats.url must be a nats:// or tls:// URL"),
    ('[nats]\nurl = "localhost:4222"\n', {}, "nats.url must be a nats:// or tls:// URL"),
    ('[nats]\nurl = "nats://:4222"\n', {}, "nats.url must name a host"),
    ('[nats]\nurl = "nats://h:99999"\n', {}, "nats.url has an invalid port"),
    ('[nats]\nurl = "nats://h:4222/path"\n', {}, "nats.url must not have a path"),
    ('[nats]\nurl = ""\n', {}, "nats.url must not be empty"),
    ('[nats]\nurl = "nats://a:1,,nats://b:2"\n', {}, "nats.url has an empty entry"),
    ("", {"GW_NATS_URL": "ftp://x"}, "nats.url (GW_NATS_URL) must be a nats:// or tls:// URL"),
    ('[nats]\nuser = "u"\n', {}, "nats.user and nats.password must be given together"),
    ('[nats]\nsubject_prefix = "gw.>"\n', {}, "nats.subject_prefix must be a NATS subject prefix"),
    ('[nats]\nsubject_prefix = "g w"\n', {}, "nats.subject_prefix must be a NATS subject prefix"),
    ("[nats]\nstream_replicas = 4.0\n", {}, "nats.stream_replicas must be an integer"),
    ("[nats]\nstream_replicas = 7\n", {}, "nats.stream_replicas must be 1..5"),
    ("[callbacks]\nretry_delays_s = 5\n", {}, "callbacks.retry_delays_s must be an array of numbers"),
    ("[callbacks]\nretry_delays_s = [1, -5]\n", {}, "callbacks.retry_delays_s item 1 must be >= 0"),
    ('[callbacks]\nretry_delays_s = [1, "x"]\n', {}, "callbacks.retry_delays_s item 1 must be a finite number"),
    ("[callbacks]\ntimeout_s = 0\n", {}, "callbacks.timeout_s must be > 0"),
    ("[callbacks]\ntimeout_s = nan\n", {}, "callbacks.timeout_s must be a finite number"),
    ('[callbacks]\nallow_private_networks = "yes"\n', {}, "callbacks.allow_private_networks must be true or false"),
    ("[deadletter]\nmax_dead_retries = -1\n", {}, "deadletter.max_dead_retries must be >= 0"),
    ("[deadletter]\nauto_redrive = 1\n", {}, "deadletter.auto_redrive must be true or false"),
    ("[deadletter]\nredrive_delay_s = -1\n", {}, "deadletter.redrive_delay_s must be >= 0"),
    ("[deadletter]\narchive_after_s = -1\n", {}, "deadletter.archive_after_s must be >= 0"),
    ("[deadletter]\nsweep_interval_s = 0\n", {}, "deadletter.sweep_interval_s must be > 0"),
    ("[dispatch]\nmax_offers_per_kind = 0\n", {}, "dispatch.max_offers_per_kind must be >= 1"),
    ("[scheduler]\nmax_concurrent_runs = 0\n", {}, "scheduler.max_concurrent_runs must be >= 1"),
    ("[scheduler]\nmin_once_delay_s = -1\n", {}, "scheduler.min_once_delay_s must be >= 0"),
    ("[scheduler]\npoll_interval_s = 0\n", {}, "scheduler.poll_interval_s must be > 0"),
    ("[scheduler]\nlease_s = 0\n", {}, "scheduler.lease_s must be > 0"),
    ("[events]\nmax_age_s = 0\n", {}, "events.max_age_s must be > 0"),
    ("[events]\nmax_msgs = 0\n", {}, "events.max_msgs must be >= 1"),
    ("[tasks]\ndefault_lease_s = 0\n", {}, "tasks.default_lease_s must be > 0"),
    ("[tasks]\ndefault_timeout_s = -3\n", {}, "tasks.default_timeout_s must be > 0"),
    ("[tasks]\ndefault_max_attempts = 0\n", {}, "tasks.default_max_attempts must be >= 1"),
    ("[tasks]\nmax_payload_bytes = 0\n", {}, "tasks.max_payload_bytes must be 1..67108864"),
    ("[tasks]\nmax_payload_bytes = 100000000\n", {}, "tasks.max_payload_bytes must be 1..67108864"),
    ("[recovery]\ngrace_s = 0\n", {}, "recovery.grace_s must be > 0"),
    ('[log]\nlevel = "loud"\n', {}, "log.level must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
]


@pytest.mark.parametrize(("toml", "env", "fragment"), BAD, ids=[b[2] for b in BAD])
def test_each_validation_error_names_its_key(tmp_path: Path, toml: str, env: dict[str, str], fragment: str) -> None:
    problems = problems_of(write_toml(tmp_path, toml), env)
    assert any(fragment in p for p in problems), problems


def test_every_problem_is_listed_at_once(tmp_path: Path) -> None:
    path = write_toml(tmp_path, 'mode = "x"\n[http]\nport = "a"\n[tasks]\ndefault_max_attempts = 0\n[zzz]\n')
    problems = problems_of(path, {"GW_NATS_PORT": "-"})
    assert len(problems) == 5, problems
    text = str(ConfigError(problems))
    for key in ("mode", "http.port", "tasks.default_max_attempts", "[zzz]", "GW_NATS_PORT"):
        assert key in text


def test_missing_file_and_bad_toml(tmp_path: Path) -> None:
    assert "does not exist" in problems_of(tmp_path / "nope.toml")[0]
    problems = problems_of(write_toml(tmp_path, f'[callbacks]\nsecret = "{SECRET}\n'))
    assert "not valid TOML" in problems[0]
    assert SECRET not in problems[0]


def test_config_is_frozen() -> None:
    c = load_config(None, {})
    with pytest.raises(AttributeError):
        c.mode = "production"  # type: ignore[misc]


# --------------------------------------------------------------------------- redaction


def test_secret_values_never_appear_in_errors(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        f'[callbacks]\nsecret = ["{SECRET}"]\n[nats]\nuser = "u"\npassword = ["{SECRET}"]\n'
        f'url = "http://u:{SECRET}@h:4222"\n',
    )
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    text = str(info.value)
    assert "callbacks.secret must be a string" in text
    assert "nats.password must be a string" in text
    assert "nats.url must be a nats:// or tls:// URL" in text
    assert SECRET not in text and SECRET not in repr(info.value.problems)


def test_redacted_hides_every_secret(tmp_path: Path) -> None:
    path = write_toml(
        tmp_path,
        f'[callbacks]\nsecret = "{SECRET}"\n[nats]\nurl = "nats://gw:{SECRET}@h:4222,nats://{SECRET}@h2"\n'
        f'user = "gw"\npassword = "{SECRET}"\n',
    )
    c = load_config(path, {})
    red = c.redacted()
    assert red["callbacks"]["secret"] == "***"
    assert red["nats"]["password"] == "***"
    assert red["nats"]["url"] == "nats://gw:***@h:4222,nats://***@h2"
    assert red["nats"]["user"] == "gw"
    dumped = json.dumps(red)  # plain data all the way down
    assert SECRET not in dumped
    assert SECRET not in repr(c) and SECRET not in str(c)
    assert red["http"] == {"host": "127.0.0.1", "port": 8080, "tls_cert_file": None, "tls_key_file": None}
    assert red["callbacks"]["retry_delays_s"] == [1.0, 5.0, 30.0]
    assert red["data_dir"] == str(c.data_dir)


def test_redacted_keeps_unset_secrets_unset() -> None:
    red = load_config(None, {}).redacted()
    assert red["callbacks"]["secret"] is None and red["nats"]["password"] is None and red["nats"]["url"] is None


# --------------------------------------------------------------------------- production rules


WEAK = [
    ("dev-token-change-me", "is a well-known default secret"),
    ("changeme", "is a well-known default secret"),
    ("secret", "is a well-known default secret"),
    ("password", "is a well-known default secret"),
    ("PassWord", "is a well-known default secret"),
    ("", "is empty"),
    ("   ", "is empty"),
    ("short-15-chars!", "is shorter than 16 characters"),
]


@pytest.mark.parametrize(("value", "reason"), WEAK)
def test_weak_callback_secret_is_a_production_problem(value: str, reason: str) -> None:
    c = load_config(None, {"GW_MODE": "production", "GW_CALLBACK_SECRET": value})
    # the whole message is fixed text: the key and the reason, nothing of the value
    assert production_problems(c) == [f"callbacks.secret {reason}"]


@pytest.mark.parametrize("value", ["changeme", "dev-token-change-me", "tiny"])
def test_weak_nats_password_is_a_production_problem(value: str) -> None:
    env = {"GW_MODE": "production", "GW_NATS_URL": "nats://h:4222", "GW_NATS_USER": "u", "GW_NATS_PASSWORD": value}
    problems = production_problems(load_config(None, env))
    assert len(problems) == 1 and problems[0].startswith("nats.password ") and value not in problems[0]


def test_weak_password_inside_the_nats_url_is_a_problem() -> None:
    c = load_config(None, {"GW_NATS_URL": "nats://u:changeme@h:4222"})
    assert production_problems(c) == ["nats.url (password or token) is a well-known default secret"]


def test_missing_or_strong_secrets_are_fine() -> None:
    assert production_problems(load_config(None, {"GW_MODE": "production"})) == []
    strong = {"GW_MODE": "production", "GW_CALLBACK_SECRET": SECRET, "GW_NATS_URL": "nats://h:4222"}
    assert production_problems(load_config(None, strong | {"GW_NATS_USER": "u", "GW_NATS_PASSWORD": SECRET})) == []


def test_findings_do_not_depend_on_mode() -> None:
    # the caller decides: refusal in production, warnings in dev
    dev = load_config(None, {"GW_CALLBACK_SECRET": "changeme"})
    prod = load_config(None, {"GW_MODE": "production", "GW_CALLBACK_SECRET": "changeme"})
    assert production_problems(dev) == production_problems(prod) != []


def test_direct_construction_has_the_defaults() -> None:
    assert Config().http.port == 8080 and Config().nats.embedded.port == 4222


# --------------------------------------------------------------------------- gatewayd check: config lines


def _embedded_toml(tmp_path: Path, extra: str = "") -> Path:
    return write_toml(tmp_path, f'data_dir = "{tmp_path / "var"}"\n{extra}\n[nats.embedded]\nport = {free_port()}\n')


def test_check_fails_on_a_bad_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_toml(tmp_path, f'data_dir = "{tmp_path}"\n[nats]\nurl = "http://u:{SECRET}@h:4222"\n')
    assert check_main(path, {}) == 1
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("FAIL config")
    assert "nats.url must be a nats:// or tls:// URL" in lines[0]
    assert SECRET not in out


def test_check_refuses_a_default_secret_in_production(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _embedded_toml(tmp_path, 'mode = "production"\n[callbacks]\nsecret = "dev-token-change-me"')
    assert check_main(path, {}) == 1
    out = capsys.readouterr().out
    config_line = next(line for line in out.splitlines() if line.split()[1] == "config")
    assert config_line.startswith("FAIL")
    assert "callbacks.secret is a well-known default secret" in config_line
    assert "dev-token-change-me" not in out


def test_check_refuses_a_secret_from_env_in_production(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _embedded_toml(tmp_path)
    assert check_main(path, {"GW_MODE": "production", "GW_CALLBACK_SECRET": "hunter2"}) == 1
    out = capsys.readouterr().out
    assert "FAIL config" in out and "callbacks.secret is shorter than 16 characters" in out
    assert "hunter2" not in out


def test_check_only_warns_about_a_weak_secret_in_dev(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _embedded_toml(tmp_path, '[callbacks]\nsecret = "hunter2"')
    assert check_main(path, {}) == 0
    out = capsys.readouterr().out
    assert out.startswith("warn config")
    assert "callbacks.secret is shorter than 16 characters" in out
    assert "hunter2" not in out


def test_check_never_prints_a_strong_secret(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _embedded_toml(tmp_path, f'mode = "production"\n[callbacks]\nsecret = "{SECRET}"')
    assert check_main(path, {}) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok   config") and SECRET not in out


def test_mode_and_log_level_ignore_case() -> None:
    c = load_config(None, {"GW_MODE": " Production ", "GW_LOG_LEVEL": "debug"})
    assert (c.mode, c.log.level) == ("production", "DEBUG")


def test_check_warns_that_nats_credentials_are_ignored_when_embedded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _embedded_toml(tmp_path, f'[nats]\nuser = "u"\npassword = "{SECRET}"')
    assert check_main(path, {}) == 0
    out = capsys.readouterr().out
    assert out.startswith("warn config") and "nats.user/nats.password are ignored" in out
    assert SECRET not in out
