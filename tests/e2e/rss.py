"""Resident set sizes of processes, sampled from /proc in a thread (the artifact tests and bench/bench_artifacts.py)."""

from __future__ import annotations

import threading
from pathlib import Path

MiB = 1024 * 1024


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


class RssProbe:
    """Samples the RSS of some PIDs every ``every_s`` in a thread; ``peak`` per name since ``reset``."""

    def __init__(self, pids: dict[str, int], every_s: float = 0.05) -> None:
        self.pids = pids
        self.every_s = every_s
        self.base: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.reset()
        self._thread.start()

    def reset(self) -> None:
        with self._lock:
            self.base = {n: rss_bytes(p) for n, p in self.pids.items()}
            self.peak = dict(self.base)

    def growth_mib(self) -> dict[str, float]:
        with self._lock:
            return {n: round((self.peak[n] - self.base[n]) / MiB, 1) for n in self.pids}

    def peak_mib(self) -> dict[str, float]:
        with self._lock:
            return {n: round(self.peak[n] / MiB, 1) for n in self.pids}

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with self._lock:
                for n, p in self.pids.items():
                    self.peak[n] = max(self.peak[n], rss_bytes(p))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
