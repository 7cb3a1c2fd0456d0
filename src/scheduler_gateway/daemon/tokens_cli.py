"""``gatewayd token create|list|revoke``: API tokens, written straight to the configured store.

A running gatewayd (any instance sharing the store) learns of a revocation from the store's revocation log
(daemon/http/principals.py), so these commands need no running daemon and no network path to it. Every create
and revoke is audited (action ``token.created`` / ``token.revoked``, object ``token``, the token's id), in the
same transaction as the change. Nothing here prints or audits a token's hash; ``create`` prints the token once.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import secrets
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from scheduler_gateway.actors import idgen
from scheduler_gateway.actors.model.records import ActorRef, AuditEntry
from scheduler_gateway.actors.ports import Principal
from scheduler_gateway.daemon.config import Config
from scheduler_gateway.daemon.http.app import token_hash
from scheduler_gateway.daemon.http.principals import REVOKE_SETTLE_S
from scheduler_gateway.daemon.store.select import Store, open_store
from scheduler_gateway.wire.errors import GatewayError
from scheduler_gateway.wire.timefmt import fmt_ts

T = TypeVar("T")

#: who the audit names for a command run on the gateway's machine (the OS user goes in the details)
CLI_ACTOR = ActorRef("system", "gatewayd-cli")


def new_token() -> str:
    return "gwt_" + secrets.token_urlsafe(32)


def _audit(action: str, principal: Principal) -> AuditEntry:
    try:
        os_user = getpass.getuser()
    except Exception:  # no name for this uid (a container): the audit still says it came from the command line
        os_user = "unknown"
    return AuditEntry(
        id=idgen.new_id("aud"),
        at=time.time(),
        action=action,
        object_type="token",
        object_id=principal.id,
        result="ok",
        actor=CLI_ACTOR,
        owner=principal.user,
        details={"user": principal.user, "role": principal.role, "osUser": os_user},
    )


async def create_principal(store: Store, user: str, role: str) -> str:
    token = new_token()
    principal = Principal(token_hash=token_hash(token), user=user, role=role, created_at=time.time())
    await store.nodes.put_principal(principal, _audit("token.created", principal))
    return token


def list_lines(principals: list[Principal]) -> list[str]:
    """A header row, then one line per token, oldest first: ``id user role createdAt lastUsedAt`` (``-``: never
    used), in aligned columns."""
    rows = [("ID", "USER", "ROLE", "CREATED", "LAST USED")]
    rows += [
        (p.id, p.user, p.role, fmt_ts(p.created_at) or "-", fmt_ts(p.last_used_at) or "-")
        for p in sorted(principals, key=lambda p: (p.created_at, p.id))
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


async def revoke(store: Store, token: str | None, user: str | None) -> list[Principal]:
    """Revoke the token with this id, or every token of ``user``; the principals revoked."""
    chosen = [
        p for p in await store.nodes.list_principals() if (p.id == token if token is not None else p.user == user)
    ]
    if not chosen:
        return []
    revoked = set(
        await store.nodes.revoke_principals(
            [p.token_hash for p in chosen], [_audit("token.revoked", p) for p in chosen]
        )
    )
    if revoked:  # a gatewayd on this file refuses the token from here on (daemon/http/principals.py)
        await asyncio.sleep(REVOKE_SETTLE_S)
    return [p for p in chosen if p.token_hash in revoked]


def _with_store(config: Config, work: Callable[[Store], Awaitable[T]]) -> T:
    async def run() -> T:
        store = open_store(config.store_location)
        await store.start()
        try:
            return await work(store)
        finally:
            await store.stop()

    return asyncio.run(run())


def token_main(config: Config, args: argparse.Namespace) -> int:
    try:
        if args.token_command == "create":
            user = args.user.strip()
            if not user or len(user) > 128:
                print("gatewayd: --user must be 1 to 128 characters", file=sys.stderr)
                return 2
            print(_with_store(config, lambda store: create_principal(store, user, args.role)))
            return 0
        if args.token_command == "list":
            for line in list_lines(_with_store(config, lambda store: store.nodes.list_principals())):
                print(line)
            return 0
        # revoke
        revoked = _with_store(config, lambda store: revoke(store, args.id, args.user))
    except GatewayError as exc:
        print(f"gatewayd: token {args.token_command}: {exc.message}", file=sys.stderr)
        return 1
    if not revoked:
        what = f"token {args.id}" if args.id is not None else f"tokens of user {args.user}"
        print(f"gatewayd: no {what} to revoke", file=sys.stderr)
        return 1
    for p in revoked:
        print(f"revoked {p.id} {p.user} {p.role}")
    return 0


def add_token_parser(token: argparse.ArgumentParser) -> None:
    """The subcommands of ``gatewayd token`` (``token``: that command's parser)."""
    token_sub = token.add_subparsers(dest="token_command", required=True)
    create = token_sub.add_parser("create", help="create a token and print it")
    create.add_argument("--user", required=True)
    create.add_argument("--role", choices=("admin", "user", "viewer"), default="user")
    create.add_argument("--config", type=Path)
    listing = token_sub.add_parser("list", help="one line per token: id user role createdAt lastUsedAt")
    listing.add_argument("--config", type=Path)
    rev = token_sub.add_parser("revoke", help="revoke one token (by id) or every token of a user")
    which = rev.add_mutually_exclusive_group(required=True)
    which.add_argument("id", nargs="?", help="the token's id, as `gatewayd token list` shows it")
    which.add_argument("--user", help="revoke every token of this user")
    rev.add_argument("--config", type=Path)
