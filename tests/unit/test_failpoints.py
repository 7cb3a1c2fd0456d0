"""Failpoints (docs/FAILPOINTS.md): the spec, the off path, the n-th hit, and the kill and the freeze themselves
in a child."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from scheduler_gateway.actors import failpoints
from scheduler_gateway.actors.failpoints import Arm


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    failpoints.configure(None)
    yield
    failpoints.configure(None)


def test_parse_names_and_counts() -> None:
    assert failpoints.parse("claim.after_commit") == {"claim.after_commit": Arm(1, "kill")}
    assert failpoints.parse(" http.after_commit@3 , settle.after_apply ,") == {
        "http.after_commit": Arm(3, "kill"),
        "settle.after_apply": Arm(1, "kill"),
    }
    assert failpoints.parse("") == {}


def test_parse_actions() -> None:
    assert failpoints.parse("schedule.after_claim:stop") == {"schedule.after_claim": Arm(1, "stop")}
    assert failpoints.parse("claim.after_thread_commit@2:stop, claim.after_commit:kill,settle.after_apply@4") == {
        "claim.after_thread_commit": Arm(2, "stop"),
        "claim.after_commit": Arm(1, "kill"),
        "settle.after_apply": Arm(4, "kill"),
    }
    assert failpoints.parse(" schedule.after_claim @ 3 : stop ") == {"schedule.after_claim": Arm(3, "stop")}
    assert Arm(1) == Arm(1, failpoints.KILL)  # the default action stays the kill


@pytest.mark.parametrize(
    "spec",
    [
        "nope",
        "nope:stop",
        "claim.after_commit@0",
        "claim.after_commit@x",
        "http.after_commit@-1",
        "claim.after_commit@",
        "claim.after_commit:",
        "claim.after_commit:freeze",
        "claim.after_commit:STOP",
        "claim.after_commit:stop@2",  # the count comes before the action
        "claim.after_commit@2:stop:kill",
        "claim.after_commit@0:stop",
    ],
)
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
    assert failpoints.armed() == {"claim.after_commit": Arm(1)}


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


def test_the_armed_stop_freezes_the_process_until_sigcont() -> None:
    """The n-th hit writes its line and SIGSTOPs the process; after SIGCONT it goes on from that very point with
    its memory intact, and the point is disarmed (later hits pass)."""
    code = (
        "import sys\n"
        "from scheduler_gateway.actors import failpoints as f\n"
        "f.configure('schedule.after_claim@2:stop,settle.after_apply:stop')\n"
        "state = {'n': 41}\n"
        "f.hit('schedule.after_claim'); print('first passed', flush=True)\n"
        "state['n'] += 1\n"
        "f.hit('schedule.after_claim'); print('continued', state['n'], sorted(f.armed()), flush=True)\n"
        "f.hit('schedule.after_claim'); print('third passed', flush=True)\n"
        "f.hit('settle.after_apply'); print('all disarmed', f._armed is None, flush=True)\n"
        "sys.exit(3)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        line = proc.stderr.readline()  # written before the stop
        assert line == "failpoint schedule.after_claim hit: stopping (SIGSTOP)\n"
        assert proc.stdout.readline() == "first passed\n"
        assert _wait_state(proc.pid, "T"), "the process was not stopped"
        time.sleep(0.3)
        assert proc.poll() is None and _state(proc.pid) == "T", "the process went on without a SIGCONT"
        proc.send_signal(signal.SIGCONT)
        assert proc.stdout.readline() == "continued 42 ['settle.after_apply']\n"
        assert proc.stdout.readline() == "third passed\n"
        assert proc.stderr.readline() == "failpoint settle.after_apply hit: stopping (SIGSTOP)\n"
        assert _wait_state(proc.pid, "T"), "the process was not stopped at the second point"
        proc.send_signal(signal.SIGCONT)
        out, err = proc.communicate(timeout=30)
        assert out == "all disarmed True\n" and err == ""
        assert proc.returncode == 3
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _state(pid: int) -> str:
    """The process state letter from /proc (``T``: stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_state(pid: int, state: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _state(pid) == state:
            return True
        time.sleep(0.01)
    return False


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
    assert failpoints.armed() == {"claim.after_commit": Arm(2)}
    monkeypatch.setenv(failpoints.ENV, "schedule.after_claim@2:stop")
    assert _arm_failpoints(load_config(None, {"GW_MODE": "dev"})) is True
    assert failpoints.armed() == {"schedule.after_claim": Arm(2, "stop")}
    monkeypatch.setenv(failpoints.ENV, "schedule.after_claim:pause")
    assert _arm_failpoints(load_config(None, {})) is False
    monkeypatch.setenv(failpoints.ENV, "claim.after_comit")
    assert _arm_failpoints(load_config(None, {})) is False
