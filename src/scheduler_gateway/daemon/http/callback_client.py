"""The callback HTTP client: the actors' ``CallbackPoster`` port on aiohttp, and the target address policy.

This module owns the one client session callbacks go out through (pooled connections, no cookies, no
proxy from the environment, no redirects: a 3xx is a failed attempt, so a receiver cannot bounce a
delivery to another host) and the rule of docs/API.md, Callbacks that in production (``allow_private_networks``
false) private, loopback and link-local targets are refused. The rule is checked on the address the
connection is actually made to: names go through a resolver that refuses any non-public answer, and
aiohttp connects to exactly what that resolver returned, so a name cannot be re-pointed between the
check and the connect. Literal IPs never reach a resolver and are checked before the request, on the host
as aiohttp's own URL parser (yarl) reads it: it folds full-width and circled digits into ASCII, so
``http://１２７.0.0.1/`` is the IP literal 127.0.0.1 to the client and must be to the check too. Last, every
socket is made by ``public_socket``, which sees the very address the connection goes to and refuses a
non-public one: whatever parsing or resolving path led there, nothing private is ever connected to.

Errors come back as short values (``CallbackPost.error``) built here from the failure's kind: never the
request headers (the signature), the body, or the URL's path and query.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import yarl
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from scheduler_gateway.actors.bus_ports import CallbackPost
from scheduler_gateway.wire.errors import Fault

log = logging.getLogger(__name__)

MAX_RESPONSE_READ = 64 * 1024  # a receiver's answer body is read (to reuse the connection), then dropped


class TargetRefused(Fault, OSError):
    """The target is not a public address (production mode)."""


def address_problem(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why a callback may not go to ``ip`` in production, or None for a public address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_private:
        return "a private address"
    if ip.is_multicast or ip.is_unspecified or ip.is_reserved or not ip.is_global:
        # shared (100.64/10), documentation, benchmarking ranges...: nothing a callback should reach
        return "not a public address"
    return None


def literal_ip_problem(host: str) -> str | None:
    """``address_problem`` for a host that is a literal IP; None for a name (checked when resolved)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None
    return address_problem(ip)


def target_host(url: str) -> str | None:
    """The host a request to ``url`` goes to, as aiohttp will read it; None when it is not an http(s) URL."""
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError):
        return None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        return None
    return parsed.host


def target_problem(url: str) -> str | None:
    """Why ``url`` is refused before any connection in production, or None (names are checked on connect)."""
    host = target_host(url)
    if host is None:
        return "not an http or https URL"
    problem = literal_ip_problem(host)
    return None if problem is None else f"{host} is {problem}"


def public_socket(addr_info: tuple[Any, ...]) -> socket.socket:
    """The connector's socket factory: the last word, on the address actually connected to."""
    family, type_, proto, _, sockaddr = addr_info
    problem = address_problem(ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0]))
    if problem is not None:
        raise TargetRefused(f"refused: {sockaddr[0]} is {problem}")
    return socket.socket(family=family, type=type_, proto=proto)


class PublicOnlyResolver(AbstractResolver):
    """Resolves as usual, then refuses the name when any of its addresses is not public."""

    def __init__(self, inner: AbstractResolver | None = None) -> None:
        self._inner = inner or DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        infos = await self._inner.resolve(host, port, family)
        for info in infos:
            problem = address_problem(ipaddress.ip_address(info["host"].split("%", 1)[0]))
            if problem is not None:
                # OSError: aiohttp hands it back inside ClientConnectorDNSError.os_error
                raise TargetRefused(f"refused: {host.rstrip('.')} resolves to {info['host']}, {problem}")
        return infos

    async def close(self) -> None:
        await self._inner.close()


class AiohttpCallbackPoster:
    """``CallbackPoster`` on one aiohttp session; ``start()`` in the running loop, ``close()`` at the end."""

    def __init__(self, *, allow_private_networks: bool, max_connections: int = 64) -> None:
        self.allow_private_networks = allow_private_networks
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            if self.allow_private_networks:
                connector = aiohttp.TCPConnector(limit=self._max_connections)
            else:
                connector = aiohttp.TCPConnector(
                    limit=self._max_connections, resolver=PublicOnlyResolver(), socket_factory=public_socket
                )
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
            )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        parts = urlsplit(url)
        host = target_host(url)
        if host is None:
            return CallbackPost(None, "not an http or https URL")
        if not self.allow_private_networks:
            problem = target_problem(url)
            if problem is not None:
                return CallbackPost(None, f"refused: {problem}")
        await self.start()
        assert self._session is not None
        try:
            async with self._session.post(
                url,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                allow_redirects=False,
            ) as resp:
                await resp.content.read(MAX_RESPONSE_READ)
                ok = 200 <= resp.status < 300
                return CallbackPost(resp.status, None if ok else f"HTTP {resp.status}")
        except TimeoutError:
            return CallbackPost(None, f"no answer within {timeout_s:g} s")
        except TargetRefused as exc:
            return CallbackPost(None, str(exc))
        except aiohttp.ClientConnectorError as exc:
            refused = _refusal_in(exc.os_error)
            if refused is not None:
                return CallbackPost(None, str(refused))
            why = exc.os_error.strerror or type(exc.os_error).__name__
            return CallbackPost(None, f"cannot connect to {host}:{parts.port or exc.port} ({why})")
        except aiohttp.InvalidURL:
            return CallbackPost(None, "not a valid URL")
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            # the kind only: some messages quote the request line, which includes the URL's query
            return CallbackPost(None, f"request failed ({type(exc).__name__})")


def _refusal_in(error: BaseException | None) -> TargetRefused | None:
    """The refusal behind a connect error: direct, or one of the attempts happy eyeballs gathered."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, TargetRefused):
            return error
        for inner in getattr(error, "exceptions", ()) or ():
            if isinstance(inner, TargetRefused):
                return inner
        error = error.__cause__ or error.__context__
    return None
