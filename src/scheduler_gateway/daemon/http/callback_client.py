"""The callback HTTP client: the actors' ``CallbackPoster`` port on aiohttp, and the target address policy.

This module owns the one client session callbacks go out through (pooled connections, no cookies, no
proxy from the environment, no redirects: a 3xx is a failed attempt, so a receiver cannot bounce a
delivery to another host) and the rule of docs/API.md, Callbacks that in production (``allow_private_networks``
false) private, loopback and link-local targets are refused. The rule is checked on the address the
connection is actually made to: names go through a resolver that refuses any non-public answer, and
aiohttp connects to exactly what that resolver returned, so a name cannot be re-pointed between the
check and the connect. Literal IPs never reach a resolver and are checked before the request.

Errors come back as short values (``CallbackPost.error``) built here from the failure's kind: never the
request headers (the signature), the body, or the URL's path and query.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from scheduler_gateway.actors.ports import CallbackPost

log = logging.getLogger(__name__)

MAX_RESPONSE_READ = 64 * 1024  # a receiver's answer body is read (to reuse the connection), then dropped


class TargetRefused(OSError):
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
            resolver = None if self.allow_private_networks else PublicOnlyResolver()
            connector = aiohttp.TCPConnector(limit=self._max_connections, resolver=resolver)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
            )

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> CallbackPost:
        parts = urlsplit(url)
        host = parts.hostname
        if parts.scheme not in ("http", "https") or not host:
            return CallbackPost(None, "not an http or https URL")
        if not self.allow_private_networks:
            problem = literal_ip_problem(host)
            if problem is not None:
                return CallbackPost(None, f"refused: {host} is {problem}")
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
        except aiohttp.ClientConnectorError as exc:
            if isinstance(exc.os_error, TargetRefused):
                return CallbackPost(None, str(exc.os_error))
            why = exc.os_error.strerror or type(exc.os_error).__name__
            return CallbackPost(None, f"cannot connect to {host}:{parts.port or exc.port} ({why})")
        except aiohttp.InvalidURL:
            return CallbackPost(None, "not a valid URL")
        except (aiohttp.ClientError, OSError, asyncio.IncompleteReadError) as exc:
            # the kind only: some messages quote the request line, which includes the URL's query
            return CallbackPost(None, f"request failed ({type(exc).__name__})")
