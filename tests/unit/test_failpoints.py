"""Failpoints (docs/FAILPOINTS.md): the spec, the off path, the n-th hit, and the kill itself in a child."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from scheduler_gateway.actors import failpoints


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    failpoints.configure(None)
    yield
    failpoints.configure(None)


def test_parse_names_and_counts() -> None:
    assert failpoints.parse("claim.after_commit") == {"claim.after_commit": 1}
    assert failpoints.parse(" http.after_commit@3 , settle.after_apply ,") == {
        "http.after_commit": 3,
        "settle.after_apply": 1,
    }
    assert failpoints.parse("") == {}


@pytest.mark.parametrize("spec", ["nope", "claim.after_commit@0", "claim.after_commit@x", "http.after_commit@-1"])
def test_a_bad_spec_is_refused(spec: str) -> None:
    with pytest.raises(failpoints.FailpointSpecError):
        failpoints.configure(spec)
    assert failpoints.armed() == {}


def test_off_is_one_none_test() -> None:
    assert failpoints._armed is None
    for name in failpoints.NAMES:
        failpoints.hit(name)  # nothing happens
    failpoints.configure("")
    assert failpoints._armed is None


def test_counts_down_before_the_kill() -> None:
    failpoints.configure("claim.after_commit@3")
    failpoints.hit("claim.after_commit")
    failpoints.hit("settle.after_apply")  # not armed: passes
    failpoints.hit("claim.after_commit")
    assert failpoints.armed() == {"claim.after_commit": 1}


def test_the_armed_hit_exits_137_naming_the_point() -> None:
    code = (
        "from scheduler_gateway.actors import failpoints as f\n"
        "f.configure('settle.after_apply@2')\n"
        "f.hit('settle.after_apply'); print('first passed', flush=True)\n"
        "f.hit('settle.after_apply'); print('never')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert proc.returncode == failpoints.EXIT_CODE
    assert proc.stdout == "first passed\n"
    assert proc.stderr == "failpoint settle.after_apply hit: exiting with 137\n"


def test_every_name_is_called_somewhere() -> None:
    """A name in the table that no code calls would arm nothing."""
    from pathlib import Path

    src = Path(failpoints.__file__).parents[1]
    text = "".join(p.read_text() for p in src.rglob("*.py") if p.name != "failpoints.py")
    for name in failpoints.NAMES:
        assert f'failpoints.hit("{name}")' in text, name


def test_gatewayd_arms_them_in_dev_and_refuses_them_in_production(monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler_gateway.daemon.cli import _arm_failpoints
    from scheduler_gateway.daemon.config import load_config

    monkeypatch.setenv(failpoints.ENV, "claim.after_commit@2")
    assert _arm_failpoints(load_config(None, {"GW_MODE": "production"})) is False
    assert failpoints.armed() == {}
    assert _arm_failpoints(load_config(None, {"GW_MODE": "dev"})) is True
    assert failpoints.armed() == {"claim.after_commit": 2}
    monkeypatch.setenv(failpoints.ENV, "claim.after_comit")
    assert _arm_failpoints(load_config(None, {})) is False
