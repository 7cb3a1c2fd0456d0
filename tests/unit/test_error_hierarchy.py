"""Every exception the daemon raises on purpose is under ``wire.errors.SchedulerGatewayError`` (one hierarchy):
a walk over every module of the daemon's packages finds each exception class defined there."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings

from aiohttp import web

from scheduler_gateway.wire.errors import Fault, GatewayError, SchedulerGatewayError

#: the packages of gatewayd; the worker SDK and the client keep their users' hierarchies (wire/errors.py says why)
DAEMON_PACKAGES = ("actors", "daemon", "wire")
DAEMON_MODULES = ("scheduler_gateway.process_lock",)


def daemon_modules() -> list[str]:
    names = list(DAEMON_MODULES)
    for package in DAEMON_PACKAGES:
        root = importlib.import_module(f"scheduler_gateway.{package}")
        names.append(root.__name__)
        prefix = root.__name__ + "."
        names += [m.name for m in pkgutil.walk_packages(root.__path__, prefix)]
    return names


def test_every_exception_the_daemon_defines_is_under_the_one_base() -> None:
    outside: list[str] = []
    seen = 0
    for name in daemon_modules():
        with warnings.catch_warnings():  # a module kept for an old path warns when imported
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != name or not issubclass(cls, BaseException):
                continue
            if issubclass(cls, web.HTTPException):  # aiohttp's way to send a response (a redirect), not an error
                continue
            seen += 1
            if not issubclass(cls, SchedulerGatewayError):
                outside.append(f"{name}.{cls.__qualname__}")
    assert seen > 20  # the walk found the daemon's exceptions (it would pass vacuously on an empty walk)
    assert outside == []


def test_answers_and_faults_are_separate_branches() -> None:
    """A fault never passes for an answer: ``except GatewayError`` (which answers a caller) does not catch one."""
    assert not issubclass(Fault, GatewayError) and not issubclass(GatewayError, Fault)
