"""``gateway-worker``: the command line of the node worker (docs/CONFIG.md).

Owns argument parsing and validation, where the NATS credentials come from (``--data-dir`` reads the
``nats.json`` the daemon writes; ``--nats/--user/--password`` name them directly), loading ``--handlers``
modules next to the built-in demo kinds, logging setup, the event loop (uvloop when installed) and the
signals: SIGTERM / SIGINT stop the worker gracefully and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from scheduler_gateway import tracing

from ._demo import register_demo_handlers
from ._options import NatsOptions
from ._registry import HandlerRegistry, load_handler_module, validate_kind, validate_node_id
from ._runtime import Worker

log = logging.getLogger("scheduler_gateway.worker_cli")

DEFAULT_CONCURRENCY = 4
DEFAULT_GRACE_S = 30.0
NATS_JSON = "nats.json"
PASSWORD_ENV = "GW_NATS_PASSWORD"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gateway-worker",
        description="Run a node worker: pull tasks of the given kinds from the gateway over NATS and run them.",
    )
    p.add_argument("--node-id", required=True, help="this node's id, [A-Za-z0-9_-]{1,64}")
    p.add_argument(
        "--kinds",
        required=True,
        help="comma-separated task kinds to run, each 1 to 64 of a-z 0-9 _ - in parts separated by single dots",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help=f"handlers running at once over all kinds (default {DEFAULT_CONCURRENCY})",
    )
    p.add_argument(
        "--handlers",
        action="append",
        default=[],
        metavar="MODULE",
        help="Python module with handlers (@handler(kind) or a HANDLERS dict); may be repeated. "
        "The demo kinds echo, sleep and fail are always available.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--data-dir",
        type=Path,
        help=f"the gateway's data dir: read NATS url and credentials from its {NATS_JSON} "
        "(the default when --nats is not given: $GW_DATA_DIR, else ./var)",
    )
    src.add_argument("--nats", metavar="URL", help="NATS server URL(s), comma-separated")
    p.add_argument("--user", help="NATS user (with --nats)")
    p.add_argument("--password", help=f"NATS password (with --nats; default ${PASSWORD_ENV}); never logged")
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=DEFAULT_GRACE_S,
        metavar="SECONDS",
        help=f"on SIGTERM/SIGINT, how long running handlers may finish (default {DEFAULT_GRACE_S:g})",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def nats_options_from_data_dir(data_dir: Path) -> NatsOptions:
    """``<data_dir>/nats.json`` = ``{"url", "user", "password"}``, written by ``gatewayd run``."""
    path = data_dir / NATS_JSON
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist: is gatewayd running with an embedded NATS there?") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    url = raw.get("url") if isinstance(raw, dict) else None
    if not isinstance(url, str) or not url:
        raise ValueError(f'{path} has no "url"')
    user, password = raw.get("user"), raw.get("password")
    if user is not None and not isinstance(user, str):
        raise ValueError(f'{path}: "user" must be a string')
    if password is not None and not isinstance(password, str):
        raise ValueError(f'{path}: "password" must be a string')
    return NatsOptions(servers=_split(url), user=user or None, password=password or None)


def _split(urls: str) -> list[str]:
    return [u.strip() for u in urls.split(",") if u.strip()]


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple[argparse.Namespace, NatsOptions]:
    """Parse and validate; every problem ends in ``parser.error`` (exit 2, message on stderr)."""
    args = parser.parse_args(argv)
    try:
        validate_node_id(args.node_id)
    except ValueError as exc:
        parser.error(str(exc))
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if not kinds:
        parser.error("--kinds names no kind")
    for kind in kinds:
        try:
            validate_kind(kind)
        except ValueError as exc:
            parser.error(str(exc))
    args.kinds = kinds
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.shutdown_grace < 0:
        parser.error("--shutdown-grace must not be negative")
    if args.nats is None and (args.user is not None or args.password is not None):
        parser.error("--user/--password go with --nats (with --data-dir they come from nats.json)")
    if args.nats is not None:
        servers = _split(args.nats)
        if not servers:
            parser.error("--nats names no URL")
        # A password on the command line is visible to every local user (ps, /proc): a service passes it
        # in the environment instead (ops/systemd/gateway-worker@.service).
        password = args.password if args.password is not None else os.environ.get(PASSWORD_ENV)
        opts = NatsOptions(servers=servers, user=args.user or None, password=password or None)
    else:
        data_dir = args.data_dir or Path(os.environ.get("GW_DATA_DIR") or "./var")
        try:
            opts = nats_options_from_data_dir(data_dir)
        except ValueError as exc:
            parser.error(str(exc))
    return args, opts


def build_registry(parser: argparse.ArgumentParser, modules: list[str], kinds: list[str]) -> HandlerRegistry:
    registry = HandlerRegistry()
    register_demo_handlers(registry)
    if modules and os.getcwd() not in sys.path:
        # A console script's sys.path starts at its own directory; handler modules usually live in the cwd.
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            brought = load_handler_module(module, registry)
        except Exception as exc:  # an arbitrary user module: any import-time error is a usage error here
            parser.error(f"--handlers {module}: {type(exc).__name__}: {exc}")
        log.info("handlers from %s: %s", module, ", ".join(brought))
    missing = [k for k in kinds if k not in registry]
    if missing:
        parser.error(f"no handler for kind(s) {', '.join(missing)}; known: {', '.join(registry.kinds())}")
    return registry


async def serve(worker: Worker, grace_s: float) -> int:
    """Run ``worker`` until SIGTERM or SIGINT, then stop it gracefully; the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    start = asyncio.create_task(worker.start())
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({start, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if start.done() and start.exception() is not None:
            log.error("worker failed to start", exc_info=start.exception())
            await worker.stop(0)
            return 1
        await stopped
        log.info("signal received: stopping")
        # stop() also interrupts a start() still waiting for NATS.
        await worker.stop(grace_s)
        await asyncio.wait({start})
        return 0
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        stopped.cancel()


def _run(main: Coroutine[Any, Any, int]) -> int:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def worker_main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, opts = _parse(parser, argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    tracing.use_task_log_format()  # a task's log lines end with task_id, attempt_id, trace_id
    tracing.configure_from_env("gateway-worker")  # a span per handler run when OTEL_* ask for export
    registry = build_registry(parser, args.handlers, args.kinds)

    async def main() -> int:
        worker = Worker(opts, node_id=args.node_id, kinds=args.kinds, concurrency=args.concurrency, registry=registry)
        return await serve(worker, args.shutdown_grace)

    return _run(main())


if __name__ == "__main__":
    sys.exit(worker_main())
