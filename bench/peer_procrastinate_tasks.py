"""The Procrastinate app of the bench's PostgreSQL peer (bench/peer_procrastinate.py): one ``echo`` task.

It owns only what the worker processes load (``procrastinate --app peer_procrastinate_tasks.app worker``): the
app, connected to the database named by ``BENCH_PROCRASTINATE_URL`` (set by the driver for the workers; the
driver itself swaps in a connector of its own), and the task, which returns its payload as the gateway's echo
handler does. Procrastinate keeps no result, so the echo's result is dropped where the gateway stores it; every
transition of the job (deferred, started, succeeded) is still written, by Procrastinate's own triggers, into
``procrastinate_events``: the timestamps the driver reads back.
"""

from __future__ import annotations

import os
from typing import Any

import procrastinate

URL_ENV = "BENCH_PROCRASTINATE_URL"

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=os.environ.get(URL_ENV, "")))


@app.task(name="echo", queue="bench")
async def echo(i: int, run: str) -> dict[str, Any]:
    return {"i": i}
