"""The admin API's HTTP server as a service: the app built at start from the API and its route groups, served
on ``host:port`` (HTTPS only when given ``TlsFiles``) by ``AdminRunner`` (the input limits of
``http.server.SERVER_SETTINGS`` and the error envelope for what aiohttp's parser refuses); ``stop`` closes it.

The route groups are declared by the composition root (``Gateway``) in one list; each is a function that
adds its routes (and middlewares) to the app, so every group runs behind the same auth, request ids and error
envelope.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web

from scheduler_gateway.daemon.http.server import AdminRunner
from scheduler_gateway.daemon.http.tls import TlsFiles, server_context

RouteGroup = Callable[[web.Application], None]


class AdminServer:
    def __init__(
        self,
        app: Callable[[], web.Application],
        routes: Sequence[RouteGroup],
        host: str,
        port: int,
        tls: TlsFiles | None = None,
    ) -> None:
        self._app = app
        #: the certificate and key served with (HTTPS only), or None (plain HTTP)
        self.tls = tls
        self.routes = tuple(routes)
        self.host = host
        #: the port served on; with 0 the one the OS picked, once started (tests)
        self.port = port
        self.runner: AdminRunner | None = None

    def build(self) -> web.Application:
        """The admin app with every route group."""
        app = self._app()
        for add in self.routes:
            add(app)
        return app

    async def start(self) -> None:
        # the context first: a bad certificate or key fails the start before anything listens
        ssl_context = None if self.tls is None else server_context(self.tls)
        runner = AdminRunner(self.build())
        await runner.setup()
        self.runner = runner
        await web.TCPSite(runner, self.host, self.port, ssl_context=ssl_context).start()
        if self.port == 0:
            for address in runner.addresses:  # (host, port, ...) of each socket served
                self.port = int(address[1])
                break

    async def stop(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            await runner.cleanup()
