"""No type that holds a secret shows it in ``repr`` or ``str``: every msgspec Struct and dataclass of the package
with a field named like a secret (``SECRET_FIELD``: secret, password, token) is walked and checked."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
import warnings
from typing import Any

import msgspec
import pytest

import scheduler_gateway
from scheduler_gateway.actors.model.records import Task
from scheduler_gateway.actors.tasks.api import NewTask
from scheduler_gateway.wire import api
from scheduler_gateway.wire.redact import SECRET_FIELD, redacted_repr

SECRET = "s3cr3t-Zq7Wk"


def _types_holding_secrets() -> list[tuple[type[Any], list[str]]]:
    found: dict[type[Any], list[str]] = {}
    for info in pkgutil.walk_packages(scheduler_gateway.__path__, "scheduler_gateway."):
        if info.name.endswith("__main__"):
            continue  # a command's entry point runs when imported
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # a deprecated alias module warns on import
            module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if not cls.__module__.startswith("scheduler_gateway"):
                continue
            if issubclass(cls, msgspec.Struct):
                names = list(cls.__struct_fields__)
            elif dataclasses.is_dataclass(cls):
                names = [f.name for f in dataclasses.fields(cls)]
            else:
                continue
            # a hash, a flag saying one is set, or a number of seconds (``token_recheck_s``) is no secret
            secret = [n for n in names if SECRET_FIELD.search(n) and not n.endswith(("_hash", "_configured", "_s"))]
            if secret:
                found[cls] = secret
    return sorted(found.items(), key=lambda kv: f"{kv[0].__module__}.{kv[0].__qualname__}")


TYPES = _types_holding_secrets()


def test_the_walk_finds_the_types_that_hold_secrets() -> None:
    names = {cls.__name__ for cls, _ in TYPES}
    assert {"Task", "NewTask", "CreateTaskBody", "BatchItemBody"} <= names, names


@pytest.mark.parametrize(("cls", "fields"), TYPES, ids=lambda v: getattr(v, "__qualname__", ""))
def test_every_type_holding_a_secret_redacts_it_in_repr(cls: type[Any], fields: list[str]) -> None:
    if issubclass(cls, msgspec.Struct):
        assert cls.__repr__ is redacted_repr or "__repr__" in vars(cls), f"{cls.__qualname__} shows {fields}"
        return
    # a dataclass's generated repr shows every field not marked repr=False
    hidden = {f.name for f in dataclasses.fields(cls) if not f.repr}
    assert set(fields) <= hidden, f"{cls.__qualname__} shows {set(fields) - hidden} in its repr"


@pytest.mark.parametrize(
    "value",
    [
        api.CreateTaskBody(kind="echo", callback_url="https://cb.example/x", callback_secret=SECRET),
        api.BatchItemBody(kind="echo", callback_url="https://cb.example/x", callback_secret=SECRET),
        NewTask(kind="echo", callback_url="https://cb.example/x", callback_secret=SECRET),
        Task(
            id="tsk_1",
            owner="alice",
            kind="echo",
            state="queued",
            revision=1,
            attempt_id="att_1",
            run_id="run_1",
            callback_url="https://cb.example/x",
            callback_secret=SECRET,
            not_before=0.0,
            created_at=0.0,
            updated_at=0.0,
        ),
    ],
    ids=lambda v: type(v).__name__,
)
def test_the_callback_secret_is_in_neither_repr_nor_str_but_still_encoded(value: Any) -> None:
    assert SECRET not in repr(value) and SECRET not in str(value) and SECRET not in f"{value!r} {value}"
    assert SECRET.encode() in msgspec.json.encode(value)  # where it is meant to go, it still goes
