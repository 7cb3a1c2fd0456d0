"""The Dramatiq + Redis peer of ``bench_gateway.py --peers``: the same N echo tasks, the same worker layout.

``bench_gateway.py`` imports this module to run the peer in the same run as the gateway and the JetStream
floor; the ``dramatiq`` worker processes import it too (``dramatiq peer_dramatiq:worker_setup``). It imports
neither dramatiq nor redis at module level, so ``bench_gateway.py`` runs without the ``bench`` extra and
:func:`missing` says why the peer is skipped.

Per repetition (method in bench/README.md):

* a private ``redis-server`` (Debian's package) on 127.0.0.1 on a free port, in a fresh temp dir, no
  persistence (no RDB snapshots, no AOF): the peer keeps nothing on disk, where the gateway commits every
  change to SQLite and JetStream's file store;
* ``python -m dramatiq peer_dramatiq:worker_setup --processes W --threads T``: W worker processes with T
  worker threads each, W and T taken from the gateway run (``--workers`` x ``--concurrency``: a thread
  runs one actor at a time, as a ``gateway-worker`` runs at most ``--concurrency`` tasks at once), Dramatiq's
  default middleware and prefetch (2 x T messages per process), ``max_retries=0``;
* one ``echo`` actor: it takes ``(run, payload)`` and pushes ``"<i> <started> <finished>"`` to the Redis list
  ``bench:done:<run>`` (one RPUSH, the echo's "result");
* warm-up: max(50, 2 x W x T) messages under another run id, all results awaited;
* burst: this process sends N messages back to back from one thread (``actor.send``, one round trip each,
  as the earlier peer baseline did; ``--peer-senders K`` splits them over K threads; with ``--rate``,
  message i is sent at t0 + i/rate) while a reader
  thread drains the results list (BLPOP, then LPOP of up to 1000); the clock runs from the first send to
  the moment the last result is read, like the floor's (first dispatch published -> last settle received);
* duplicates: a result read twice for one i; lost: an i with no result when ``--timeout`` ran out;
* stop: SIGTERM to the dramatiq main process (it stops its workers), then redis-server, by PID; SIGKILL
  after a grace period, and only to PIDs whose command line still is ours.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

HERE = Path(__file__).resolve().parent
URL_ENV = "BENCH_PEER_REDIS_URL"
QUEUE = "bench-echo"
ACTOR = "echo"
WORKER_MARK = "peer_dramatiq:worker_setup"  # in the worker processes' command line: how we recognise ours


def missing() -> str | None:
    """Why the peer cannot run here (one line), or None when redis-server and dramatiq[redis] are there."""
    gone = []
    if shutil.which("redis-server") is None:
        gone.append("redis-server (apt-get install redis-server)")
    if importlib.util.find_spec("dramatiq") is None or importlib.util.find_spec("redis") is None:
        gone.append("dramatiq[redis] (pip install -c constraints.txt -e '.[bench]')")
    return " and ".join(gone) + " not found" if gone else None


def versions() -> dict[str, str]:
    import dramatiq
    import redis

    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True, check=False).stdout
    server = next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), "?")
    return {"dramatiq": dramatiq.__version__, "redis_py": redis.__version__, "redis_server": server}


# ------------------------------------------------------------------------------------------------ workers


def worker_setup() -> None:
    """Called by ``dramatiq peer_dramatiq:worker_setup`` in each worker process: broker and the echo actor."""
    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker

    url = os.environ[URL_ENV]
    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    done = redis.Redis.from_url(url)  # a connection pool, shared by the worker threads

    def echo(run: str, payload: dict[str, Any]) -> dict[str, Any]:
        started = time.time()
        done.rpush(f"bench:done:{run}", b"%d %.6f %.6f" % (payload["i"], started, time.time()))
        return payload

    dramatiq.actor(echo, actor_name=ACTOR, queue_name=QUEUE, max_retries=0, broker=broker)


# ------------------------------------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def children(pid: int) -> list[int]:
    """Direct children of pid, from /proc (the dramatiq main process forks its worker processes)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            out.append(int(d))
    return out


def stop(proc: subprocess.Popen[bytes] | None, grace_s: float, extra: Sequence[int] = (), mark: bytes = b"") -> None:
    """SIGTERM by PID, wait, then SIGKILL it and the `extra` PIDs whose command line still holds `mark`."""
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    for pid in extra:  # worker processes left behind by a main process that did not stop them
        if mark and mark in cmdline(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


class RedisServer:
    """redis-server on 127.0.0.1:<free port>, data dir in `tmp`, no RDB and no AOF."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        import redis

        args = ["redis-server", "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.dir)]
        args += ["--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes"]
        args += ["--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 15
        client = redis.Redis.from_url(self.url)
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"redis-server did not come up on port {self.port} (see {self.dir}/redis.log)")
                time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        stop(self.proc, 10.0)


class Workers:
    """``python -m dramatiq peer_dramatiq:worker_setup``: one main process and `processes` forked workers."""

    def __init__(self, url: str, processes: int, threads: int, log: Path) -> None:
        self.args = [sys.executable, "-m", "dramatiq", WORKER_MARK, "--path", str(HERE)]
        self.args += ["--processes", str(processes), "--threads", str(threads), "--queues", QUEUE]
        self.env = {**os.environ, URL_ENV: url}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.forked: list[int] = []

    def start(self) -> None:
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.args, env=self.env, cwd=HERE, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )

    def pids(self) -> list[int | None]:
        assert self.proc is not None
        self.forked = children(self.proc.pid)
        return [self.proc.pid, *self.forked]

    def stop(self) -> None:
        stop(self.proc, 30.0, self.forked or (children(self.proc.pid) if self.proc else []), WORKER_MARK.encode())


# ------------------------------------------------------------------------------------------------ producer


class Results:
    """Reads ``bench:done:<run>`` on its own connection in a thread; per i the first result, repeats counted."""

    def __init__(self, url: str, run: str, n: int) -> None:
        import redis

        self.client = redis.Redis.from_url(url)
        self.key = f"bench:done:{run}"
        self.n = n
        self.started: list[float | None] = [None] * n
        self.finished: list[float | None] = [None] * n
        self.read_at: list[float | None] = [None] * n
        self.got = 0
        self.dup = 0
        self.last_at = 0.0
        self.all_in = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"results-{run}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            first = self.client.blpop([self.key], timeout=0.2)
            if first is None:
                continue
            batch = [first[1], *(self.client.lpop(self.key, 1000) or [])]
            now = time.time()
            for raw in batch:
                i_s, started, finished = raw.split()
                i = int(i_s)
                if self.read_at[i] is not None:
                    self.dup += 1
                    continue
                self.started[i], self.finished[i], self.read_at[i] = float(started), float(finished), now
                self.got += 1
            self.last_at = now
            if self.got >= self.n:
                self.all_in.set()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.client.close()


class Probe(Protocol):
    def begin(self) -> None: ...
    def end(self, n: int) -> dict[str, float]: ...


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile, as in bench_gateway.py."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[max(0, min(len(s) - 1, round(p / 100.0 * len(s) + 0.5) - 1))]


def lat_ms(prefix: str, seconds: list[float]) -> dict[str, float]:
    out = {f"{prefix}_p{p}_ms": pct(seconds, p) * 1e3 for p in (50, 95, 99)}
    out[f"{prefix}_max_ms"] = max(seconds) * 1e3 if seconds else float("nan")
    return out


def run_rep(
    n: int,
    rate: float,
    senders: int,
    processes: int,
    threads: int,
    timeout_s: float,
    scratch: Path,
    keep: bool,
    make_probe: Callable[[dict[str, list[int | None]]], Probe],
) -> dict[str, Any]:
    """One repetition on fresh processes; the record has the keys of bench_gateway.py's floor record."""
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    tmp = Path(tempfile.mkdtemp(prefix="dramatiq-", dir=scratch))
    server = RedisServer(tmp)
    workers: Workers | None = None
    broker = None
    ok = False
    try:
        server.start()
        workers = Workers(server.url, processes, threads, tmp / "workers.log")
        workers.start()
        broker = RedisBroker(url=server.url)

        def echo(run: str, payload: dict[str, Any]) -> None:  # the producer's handle; the workers run theirs
            raise AssertionError("runs in the dramatiq workers")

        actor = dramatiq.actor(echo, actor_name=ACTOR, queue_name=QUEUE, max_retries=0, broker=broker)

        # Warm-up, outside the measurement: the worker processes import, connect and start fetching.
        warm_n = max(50, 2 * processes * threads)
        warm = Results(server.url, "warmup", warm_n)
        warm.start()
        for i in range(warm_n):
            actor.send("warmup", {"i": i})
        if not warm.all_in.wait(60):
            raise RuntimeError(f"dramatiq warm-up: {warm.got} of {warm_n} results in 60 s (see {tmp}/workers.log)")
        warm.close()

        res = Results(server.url, "run", n)
        res.start()
        probe = make_probe({"redis": [server.proc.pid if server.proc else None], "workers": workers.pids()})
        sent = [0.0] * n
        probe.begin()
        t0 = time.time()

        def send(first: int) -> None:  # sender k sends i = k, k + senders, ...
            for i in range(first, n, senders):
                if rate > 0:  # open loop, like the gateway's paced submit: task i is due at t0 + i/rate
                    delay = t0 + i / rate - time.time()
                    if delay > 0:
                        time.sleep(delay)
                sent[i] = time.time()
                actor.send("run", {"i": i})

        if senders <= 1:
            send(0)
        else:  # redis-py's pool gives each thread its own connection
            pool = [threading.Thread(target=send, args=(k,)) for k in range(senders)]
            for t in pool:
                t.start()
            for t in pool:
                t.join()
        submit_s = time.time() - t0
        res.all_in.wait(timeout_s)
        cpu = probe.end(n)
        res.close()
        ok = True
    finally:
        if broker is not None:
            broker.close()
        if workers is not None:
            workers.stop()
        server.stop()
        if ok and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"  (kept {tmp} with the logs)", file=sys.stderr)

    queue, execute, e2e = [], [], []
    for i in range(n):
        started, read_at = res.started[i], res.read_at[i]
        if started is not None and read_at is not None:
            queue.append(started - sent[i])
            execute.append(read_at - started)
            e2e.append(read_at - sent[i])
    span = res.last_at - t0 if res.got else float("nan")
    rec: dict[str, Any] = {
        "system": "dramatiq",
        "n": n,
        "created": n,
        "terminal": res.got,
        "lost": n - res.got,
        "duplicates": res.dup,
        "complete": res.got == n,
        "secs": span,
        "tasks_per_s": res.got / span if res.got else float("nan"),
        "submit_s": submit_s,
        "offered_per_s": n / submit_s if submit_s > 0 else float("nan"),
        "peer_processes": processes,
        "peer_threads": threads,
        "peer_senders": senders,
        **versions(),
    }
    rec.update(lat_ms("queue", queue))
    rec.update(lat_ms("exec", execute))
    rec.update(lat_ms("e2e", e2e))
    rec.update(cpu)
    return rec
