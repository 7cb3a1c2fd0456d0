"""A small tmpfs for full-disk tests (issue 22, point 3): mounted for one test, filled by a ballast file, freed,
unmounted. Mounting needs root (or CAP_SYS_ADMIN); elsewhere the test is skipped and says why."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

CHUNK = 256 * 1024


class SmallDisk:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.ballast = path / ".ballast"

    def fill(self) -> int:
        """Write the ballast until the file system says ENOSPC (down to the last byte); the bytes written."""
        written = 0
        fd = os.open(self.ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for size in (CHUNK, 4096, 512, 1):
                block = b"\0" * size
                while True:
                    try:
                        n = os.write(fd, block)
                    except OSError as exc:
                        if exc.errno != errno.ENOSPC:
                            raise
                        break
                    written += n
                    if n < size:
                        break
        finally:
            os.close(fd)
        return written

    def free(self) -> None:
        self.ballast.unlink(missing_ok=True)

    def free_bytes(self) -> int:
        st = os.statvfs(self.path)
        return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def small_disk(path: Path, size: str = "24m") -> Iterator[SmallDisk]:
    if os.geteuid() != 0:
        pytest.skip("the full-disk tests mount a tmpfs: they need root (run them as root, e.g. in the CI container)")
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {path} (no CAP_SYS_ADMIN here?): {done.stderr.strip()}")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)
