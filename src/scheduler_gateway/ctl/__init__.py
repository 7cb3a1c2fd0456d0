"""``gatewayctl``: the operator's command line over the gateway's HTTP API, built on ``scheduler_gateway.client``
(docs/CLI.md; CONTRACT section 5).

Exit status: 0 done; 1 the gateway refused (its stable code first on the one line on stderr), or a waited-for
task or workflow did not succeed; 2 a usage error (an unknown flag, a payload that is not JSON, an unreadable token
file) or no gateway to talk to. The token is read from its file or variable and never printed."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._parser import DEFAULT_TOKEN_FILE, DEFAULT_URL, build_parser

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    pass


def _complete(parser: Any) -> None:
    """Shell completion: when the shell's completion function runs us (``_ARGCOMPLETE`` set), answer and exit."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:  # pragma: no cover - argcomplete is a dependency of the package
        sys.exit(1)
    argcomplete.autocomplete(parser)


def completion_script(shell: str) -> str:
    from argcomplete.shell_integration import shellcode

    return str(shellcode(["gatewayctl"], shell=shell))


def resolve_url(given: str | None, env: dict[str, str] | None = None) -> str:
    env = dict(os.environ) if env is None else env
    url = (given or env.get("GATEWAY_URL") or DEFAULT_URL).strip()
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"the gateway URL must start with http:// or https:// (got {url[:80]!r})")
    return url.rstrip("/")


def resolve_token(given: str | None, env: dict[str, str] | None = None, cwd: Path | None = None) -> str | None:
    """The token from ``--token-file``, else ``GATEWAY_TOKEN``, else ``./var/admin.token`` when it exists."""
    env = dict(os.environ) if env is None else env
    if given is not None:
        try:
            token = Path(given).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
            raise UsageError(f"cannot read --token-file {given}: {reason}") from None
        if not token:
            raise UsageError(f"--token-file {given} is empty")
        return token
    if env.get("GATEWAY_TOKEN", "").strip():
        return env["GATEWAY_TOKEN"].strip()
    default = (cwd or Path.cwd()) / DEFAULT_TOKEN_FILE
    if default.is_file():
        try:
            return default.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None
    return None


def token_source(given: str | None, env: dict[str, str] | None = None, cwd: Path | None = None) -> str | None:
    """Where ``resolve_token`` found the token, for a message (never the token): None when it found none."""
    env = dict(os.environ) if env is None else env
    if given is not None:
        return f"--token-file {given}"
    if env.get("GATEWAY_TOKEN", "").strip():
        return "GATEWAY_TOKEN"
    default = (cwd or Path.cwd()) / DEFAULT_TOKEN_FILE
    return str(default) if default.is_file() else None


def refusal_hint(code: str, source: str | None) -> str:
    """What to do about a refusal of the token: where the token came from, or where none was found."""
    if code == "UNAUTHENTICATED" and source is None:
        return (
            f"; no token found (looked at --token-file, GATEWAY_TOKEN, then {Path.cwd() / DEFAULT_TOKEN_FILE}):"
            " pass --token-file FILE or set GATEWAY_TOKEN (gatewayd token create --user NAME makes a token)"
        )
    if code == "UNAUTHENTICATED":
        return f"; the token from {source} was refused (revoked, or not this gateway's): give another one"
    if code == "FORBIDDEN":
        return (
            f"; the token from {source or 'nowhere'} may not do this: use a token with that right"
            " (--token-file FILE or GATEWAY_TOKEN)"
        )
    return ""


def _err(message: str) -> None:
    sys.stderr.write(f"gatewayctl: {message}\n")
    sys.stderr.flush()


async def _run(args: Any, url: str, token: str | None, source: str | None = None) -> int:
    from scheduler_gateway.client import CONNECTION_FAILED, GatewayClient, GatewayClientError

    from ._commands import COMMANDS, Ctx, Failed
    from ._render import Progress
    from ._workflow_commands import WORKFLOW_COMMANDS

    output = args.output or ("table" if sys.stdout.isatty() else "json")
    async with GatewayClient(url, token, retries=2, backoff_s=0.1, timeout_s=30.0) as gw:
        ctx = Ctx(gw=gw, output=output, out=sys.stdout, progress=Progress(sys.stderr))
        try:
            command = COMMANDS.get((args.group, args.action)) or WORKFLOW_COMMANDS[(args.group, args.action)]
            await command(ctx, args)
        except Failed as exc:
            _err(f"{exc.code}: {exc.message}")
            return EXIT_REFUSED
        except ValueError as exc:
            _err(str(exc))
            return EXIT_USAGE
        except GatewayClientError as exc:
            if exc.code == CONNECTION_FAILED:
                _err(f"cannot reach the gateway at {url}: {_reason(exc)}")
                return EXIT_USAGE
            request = f" (request {exc.request_id})" if exc.request_id else ""
            _err(f"{exc.code}: {_one_line(exc.message)}{refusal_hint(exc.code, source)}{request}")
            return EXIT_REFUSED
    return EXIT_OK


def _one_line(text: str) -> str:
    return " ".join(text.split())[:500]


def _reason(exc: Exception) -> str:
    text = str(getattr(exc, "message", exc))
    for hint, said in (
        ("connect call failed", "connection refused"),
        ("connection refused", "connection refused"),
        ("name or service not known", "unknown host"),
        ("nodename nor servname", "unknown host"),
        ("temporary failure in name resolution", "unknown host"),
        ("timeout", "timed out"),
        ("timed out", "timed out"),
    ):
        if hint in text.lower():
            return said
    return _one_line(text)[:200]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if args.group == "completion":
        sys.stdout.write(completion_script(args.shell))
        return EXIT_OK
    try:
        url = resolve_url(args.url)
        token = resolve_token(args.token_file)
        source = token_source(args.token_file) if token is not None else None
    except UsageError as exc:
        _err(str(exc))
        return EXIT_USAGE
    import asyncio

    try:
        return asyncio.run(_run(args, url, token, source))
    except KeyboardInterrupt:
        return EXIT_OK if (args.group, args.action) == ("events", "tail") else 130
    except BrokenPipeError:  # `gatewayctl ... | head`: the reader left
        with contextlib.suppress(OSError):  # quiet the flush at exit (the Python docs' recipe)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


def gatewayctl_main() -> None:
    sys.exit(main())


__all__ = ["gatewayctl_main", "main", "resolve_token", "resolve_url"]
