"""sd_notify without a dependency: READY=1, WATCHDOG=1 and STOPPING=1 over ``$NOTIFY_SOCKET``.

The watchdog ping is sent from the event loop itself, so a stalled loop stops pinging and systemd
restarts the daemon (``WatchdogSec`` in the unit).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from scheduler_gateway.actors.runtime import cancel_and_wait

log = logging.getLogger(__name__)


class SystemdNotifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self._address = env.get("NOTIFY_SOCKET") or None
        usec = env.get("WATCHDOG_USEC", "")
        self.watchdog_s: float | None = int(usec) / 1_000_000 if usec.isdigit() and int(usec) > 0 else None
        self._task: asyncio.Task[None] | None = None

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, message: str) -> bool:
        if self._address is None:
            return False
        address = self._address
        if address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.connect(address)
                sock.sendall(message.encode())
            return True
        except OSError as exc:
            log.warning("sd_notify %s failed: %s", message.split("=")[0], exc.strerror)
            return False

    def ready(self) -> None:
        self.notify("READY=1\nSTATUS=serving")
        if self.watchdog_s is not None and self._task is None:
            self._task = asyncio.create_task(self._watchdog(self.watchdog_s / 2))

    def stopping(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self.notify("STOPPING=1")

    async def _watchdog(self, every_s: float) -> None:
        while True:
            self.notify("WATCHDOG=1")
            await asyncio.sleep(every_s)

    async def aclose(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None
