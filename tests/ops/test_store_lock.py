"""One gatewayd per SQLite store (``process_lock.py``, docs/OPERATIONS.md): a second ``gatewayd run`` on
the same file, from another data dir, is refused in one line naming the holder's pid before it starts anything;
``gatewayd export`` is refused while a gatewayd runs on the file; a kill -9 of the holder frees the file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler_gateway.process_lock import InUse, ProcessLock, store_lock
from tests.e2e.procs import Daemon, free_port
from tests.ops.helpers import BIN


def _env(data_dir: Path, db: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("GW_NATS_URL", None)
    env.update(
        GW_DATA_DIR=str(data_dir),
        GW_HTTP_PORT=str(free_port()),
        GW_NATS_PORT=str(free_port()),
        GW_MODE="dev",
        GW_STORE_URL=f"sqlite:///{db}",
    )
    return env


def test_a_second_gatewayd_on_the_same_sqlite_file_is_refused_until_the_first_is_gone(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = Daemon(tmp_path / "a")
    first.start()
    try:
        assert first.proc is not None
        pid = first.proc.pid
        db = tmp_path / "a" / "gateway.db"
        env = _env(tmp_path / "b", db)
        second = subprocess.run([str(BIN / "gatewayd"), "run"], env=env, capture_output=True, text=True, timeout=60)
        assert second.returncode == 1, second.stderr
        assert f"gatewayd: the task store {db} is in use by the gatewayd with pid {pid}" in second.stderr
        assert not (tmp_path / "b" / "nats").exists()  # refused before its embedded NATS started
        export = tmp_path / "export.jsonl"
        done = subprocess.run(
            [str(BIN / "gatewayd"), "export", "--to", str(export)], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 1
        assert f"the gatewayd with pid {pid} runs on {db}: stop it first" in done.stderr
        assert not export.exists()
        first.kill9()  # the kernel drops the lock with the process
        first.kill_orphan_nats()
        again = Daemon(tmp_path / "b", extra_env={"GW_STORE_URL": f"sqlite:///{db}"})
        again.start()
        try:
            assert again.proc is not None and again.proc.poll() is None
        finally:
            assert again.stop() == 0
            again.kill_orphan_nats()
    finally:
        first.stop()
        first.kill_orphan_nats()


def test_the_lock_names_its_holder_and_is_free_again_once_released(tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(db) + '.lock'!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, b'%d\\n' % os.getpid())\n"
            "print('held', flush=True)\n"
            "time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        lock = store_lock(db)
        assert lock.holder() == str(holder.pid)
        with pytest.raises(InUse) as info:
            lock.take()
        assert info.value.holder == str(holder.pid)
    finally:
        holder.kill()
        holder.wait(5)
        if holder.stdout is not None:
            holder.stdout.close()
    lock.take()  # its process is gone, and its lock with it
    assert lock.holder() is None  # held by this process: nobody else
    assert (tmp_path / "gateway.db.lock").read_text() == f"{os.getpid()}\n"
    lock.release()
    assert ProcessLock(tmp_path / "gateway.db.lock").holder() is None
