"""README.md's code blocks run as written (issue 53): every fenced ``bash`` and ``python`` block, in order, from
a directory laid out as a fresh clone after ``make run`` (``.venv`` and ``var/`` beside the README), against
``scripts/dev-run.sh`` (what ``make run`` runs: gatewayd with embedded NATS and the demo worker) started by the
test. A block that cannot run here is marked in the README with ``<!-- readme-test: skip (why) -->`` on the line
before it; any other block failing (non-zero exit, a traceback) fails the test. A handler example whose first
line says ``# FILE.py — run with: COMMAND`` is saved as FILE.py and COMMAND run as written, and it must run a
task of its kind. One substitution only: the README's port 8080 becomes a free port (in the text and as
gatewayctl's ``GATEWAY_URL``), so the test never meets another server on 8080."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from scheduler_gateway.daemon.nats.nats_server import free_port

from .helpers import BIN, REPO, reap_children, spawn_dev_run, wait_for_demo_worker

README = REPO / "README.md"
SKIP = re.compile(r"\A<!-- readme-test: skip \((?P<why>.+)\) -->\Z")
FENCE = re.compile(r"\A```(?P<lang>[a-z]*)\Z")
BLOCK_TIMEOUT_S = 60


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    text: str
    skip: str | None


def blocks(text: str) -> list[Block]:
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.fullmatch(lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        marker = SKIP.fullmatch(lines[start - 1]) if start > 0 else None
        out.append(Block(start + 1, opening["lang"], "\n".join(body) + "\n", marker["why"] if marker else None))
        i += 1
    return out


def test_every_block_is_runnable_or_marked() -> None:
    found = blocks(README.read_text())
    assert len(found) >= 10
    for b in found:
        assert b.skip is not None or b.lang in ("bash", "python"), f"README.md:{b.line}: ```{b.lang} is not run"


@pytest.fixture
def clone(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A directory like a fresh clone after ``make run`` in another terminal: ``.venv`` here, the daemon's
    data in ``./var``; yields it and the HTTP port."""
    (tmp_path / ".venv").symlink_to(BIN.parent)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GW_")}
    env.update(VENV=".venv", GW_HTTP_PORT=str(port), GW_NATS_PORT=str(free_port()))
    log_path = tmp_path / "make-run.log"
    proc = spawn_dev_run(tmp_path, env, log_path)
    try:
        wait_for_demo_worker(proc, log_path, 60)
        yield tmp_path, port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as in the README
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                reap_children(log_path.read_text())
    assert "Traceback" not in log_path.read_text(), log_path.read_text()


def test_readme_blocks_run_as_written(clone: tuple[Path, int]) -> None:
    here, port = clone
    env = {k: v for k, v in os.environ.items() if not k.startswith("GW_") and k != "GATEWAY_URL"}
    env["PATH"] = os.environ.get("PATH", "")  # as a new user's shell: .venv/bin is not on it
    env["GATEWAY_URL"] = f"http://127.0.0.1:{port}"  # gatewayctl's default is the README's 8080
    ran = handlers = 0
    for b in blocks(README.read_text()):
        if b.skip is not None:
            continue
        code = b.text.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        argv = ["bash", "-e", "-o", "pipefail", "-c", code] if b.lang == "bash" else [str(BIN / "python"), "-c", code]
        done = subprocess.run(argv, cwd=here, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        shown = f"README.md:{b.line} ({b.lang}) exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert done.returncode == 0, shown
        assert "Traceback" not in done.stderr, shown
        ran += 1
        module = HANDLER_MODULE.match(code)
        if module is not None:
            check_handler_module(here, env, code, module["file"], module["command"])
            handlers += 1
    assert ran >= 8 and handlers == 1


#: a handler example's first line names its file and the command that serves it
HANDLER_MODULE = re.compile(r"# (?P<file>[a-z_]+\.py) — run with: (?P<command>[^\n]+)\n")


def check_handler_module(here: Path, env: dict[str, str], code: str, file: str, command: str) -> None:
    """Save the block as ``file``, run ``command`` as written (a worker), and have it run one task of its kind."""
    kinds = re.search(r"--kinds (\S+)", command)
    assert kinds is not None, command
    (here / file).write_text(code)
    log_path = here / f"{file}.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(["bash", "-c", f"exec {command}"], cwd=here, env=env, stdout=log, stderr=log)
    try:
        submit = [".venv/bin/gatewayctl", "tasks", "submit", kinds[1], "--payload", "{}", "--wait"]
        done = subprocess.run(submit, cwd=here, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
        assert done.returncode == 0, done.stdout + done.stderr + log_path.read_text()
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log_path.read_text()
    assert "Traceback" not in log_path.read_text(), log_path.read_text()
