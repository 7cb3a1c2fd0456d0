"""Every pattern in wire/ matches the whole string (issue 49 point 1b): ``$`` also matches before a final newline,
so ``"evil\\n"`` passed a pattern anchored with it. Found by walking wire/ (compiled patterns, ``*_PATTERN``
strings, the ``Meta(pattern=...)`` of every Struct field), so a pattern added later is checked too; and the named
checks at the doors (kind, node id, subject prefix, ids) refuse what NATS could not take."""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import scheduler_gateway.wire as wire
from scheduler_gateway.wire import api as wire_api
from scheduler_gateway.wire import messages as wire_messages
from scheduler_gateway.wire import names
from scheduler_gateway.wire.ids import is_id


def _struct_patterns(t: Any) -> Iterator[str]:
    """The string patterns of a msgspec type and its fields, as msgspec checks them."""
    seen: set[int] = set()

    def walk(info: Any) -> Iterator[str]:
        if id(info) in seen:
            return
        seen.add(id(info))
        if isinstance(info, msgspec.inspect.StrType) and info.pattern is not None:
            yield info.pattern
        if isinstance(info, msgspec.inspect.StructType | msgspec.inspect.DataclassType):
            for f in info.fields:
                yield from walk(f.type)
        for attr in ("item_type", "key_type", "value_type", "types", "item_types"):
            inner = getattr(info, attr, None)
            if isinstance(inner, tuple):
                for i in inner:
                    yield from walk(i)
            elif inner is not None:
                yield from walk(inner)

    yield from walk(msgspec.inspect.type_info(t))


def wire_patterns() -> dict[str, str]:
    """name -> pattern, for every pattern in wire/ that anchors itself (an unanchored one is a search pattern,
    ``redact``'s, or matched with ``fullmatch`` by its module: both checked below)."""
    out: dict[str, str] = {}
    for mod in pkgutil.iter_modules(wire.__path__):
        module = importlib.import_module(f"{wire.__name__}.{mod.name}")
        for attr, value in vars(module).items():
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                out[f"{mod.name}.{attr}"] = value.pattern
            elif isinstance(value, str) and attr.endswith("PATTERN"):
                out[f"{mod.name}.{attr}"] = value
            elif isinstance(value, type) and issubclass(value, msgspec.Struct):
                for i, p in enumerate(_struct_patterns(value)):
                    out[f"{mod.name}.{attr}[{i}]"] = p
    return out


PATTERNS = wire_patterns()
ANCHORED = {k: p for k, p in PATTERNS.items() if p.startswith(("^", "\\A"))}
assert ANCHORED, "the walk found no anchored pattern"


def test_the_walk_finds_the_patterns_of_the_doors() -> None:
    found = set(PATTERNS.values())
    assert names.KIND_PATTERN in found and names.NODE_ID_PATTERN in found
    assert any(k.startswith("api.CreateTaskBody") for k in PATTERNS)  # Struct fields are walked


def _anchors(pattern: str) -> set[str]:
    """The anchors a pattern uses, read from Python's own parse of it (a ``$`` in a class is a literal)."""
    c: Any = importlib.import_module("re._constants")  # Python's own parse of a pattern (3.11+)
    parser: Any = importlib.import_module("re._parser")

    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, parser.SubPattern):
            node = node.data
        if isinstance(node, tuple) and len(node) == 2 and node[0] is c.AT:
            found.add(str(node[1]))
        elif isinstance(node, list | tuple):
            for item in node:
                walk(item)

    walk(parser.parse(pattern))
    return found


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_no_pattern_in_wire_anchors_with_a_dollar_or_a_caret(name: str) -> None:
    pattern = PATTERNS[name]
    anchors = _anchors(pattern)
    assert "AT_END" not in anchors, f"{name}: {pattern!r} uses $, which matches before a final newline: use \\Z"
    assert "AT_BEGINNING" not in anchors, f"{name}: {pattern!r} uses ^: use \\A"


@pytest.mark.parametrize("name", sorted(ANCHORED))
@settings(max_examples=40)
@given(data=st.data())
def test_a_matching_string_with_a_newline_or_a_nul_after_it_is_refused(name: str, data: st.DataObject) -> None:
    pattern = ANCHORED[name]
    value = data.draw(st.from_regex(pattern, fullmatch=True), label="value")
    assert re.search(pattern, value) is not None  # search: how msgspec's Meta(pattern) checks
    tail = data.draw(st.sampled_from(["\n", "\x00", "\r\n", "\n\n"]), label="tail")
    assert re.search(pattern, value + tail) is None, (name, value + tail)
    assert re.search(pattern, tail + value) is None, (name, tail + value)


KIND_ALPHABET = st.sampled_from("abcz09_-.")


@given(st.text(KIND_ALPHABET, min_size=1, max_size=64))
def test_a_kind_is_non_empty_parts_between_single_dots(kind: str) -> None:
    expected = not any(part == "" for part in kind.split("."))
    assert names.is_kind(kind) is expected
    assert names.is_kind(kind + "\n") is False
    assert names.is_kind(kind + "A") is False


@given(st.text(min_size=0, max_size=80))
def test_a_kind_and_a_node_id_take_only_their_characters(value: str) -> None:
    if names.is_kind(value):
        assert 1 <= len(value) <= 64 and set(value) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.-")
        assert ".." not in value and not value.startswith(".") and not value.endswith(".")
    if names.is_node_id(value):
        node_alphabet = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
        assert 1 <= len(value) <= 64 and set(value) <= node_alphabet


@pytest.mark.parametrize("kind", ["a..b", "a.", ".", ".a", "evil\n", "A", "x" * 65, "", "a b", "a*", "a>", "ä"])
def test_the_bad_kinds_of_the_issue_are_refused_everywhere(kind: str) -> None:
    assert not names.is_kind(kind)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"kind": kind}, wire_api.CreateTaskBody)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"kinds": [kind]}, wire_messages.HeartbeatRequest)


def test_node_ids_subject_prefixes_and_ids_take_the_whole_string() -> None:
    assert names.is_node_id("node-1_A") and not names.is_node_id("node-1\n") and not names.is_node_id("a.b")
    assert (
        names.is_subject_prefix("gw.prod")
        and not names.is_subject_prefix("gw.")
        and not names.is_subject_prefix("gw\n")
    )
    good = "tsk_" + "0" * 32
    assert is_id(good) and not is_id(good + "\n") and not is_id("\n" + good)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"taskId": "t", "attemptId": "a", "processId": "p\n"}, wire_messages.ClaimRequest)
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"kind": "echo", "threadId": "thr_1\n"}, wire_api.CreateTaskBody)


def test_the_worker_sdk_refuses_a_bad_kind_and_node_id() -> None:
    from scheduler_gateway.worker._registry import validate_kind, validate_node_id

    for kind in ("a..b", "evil\n", "a."):
        with pytest.raises(ValueError, match="invalid kind"):
            validate_kind(kind)
    with pytest.raises(ValueError, match="invalid node id"):
        validate_node_id("node\n")
    assert validate_kind("a.b") == "a.b" and validate_node_id("n-1") == "n-1"


def package_patterns() -> dict[str, str]:
    """Every module-level compiled pattern of the package (the daemon's, the worker SDK's and the client's doors
    included)."""
    import scheduler_gateway

    out: dict[str, str] = {}
    for info in pkgutil.walk_packages(scheduler_gateway.__path__, scheduler_gateway.__name__ + "."):
        if info.name.endswith("__main__"):
            continue  # entry points: a command runs when imported
        module = importlib.import_module(info.name)
        for attr, value in vars(module).items():
            if isinstance(value, re.Pattern) and isinstance(value.pattern, str):
                out[f"{info.name}.{attr}"] = value.pattern
    return out


def test_no_compiled_pattern_in_the_package_anchors_with_a_dollar() -> None:
    """``$`` matches before a final newline: a check anchored with it lets ``"name\\n"`` through."""
    patterns = package_patterns()
    assert len(patterns) > 20, patterns  # the walk reached the daemon's modules
    dollars = {name: p for name, p in patterns.items() if "AT_END" in _anchors(p)}
    assert dollars == {}, dollars


@pytest.mark.parametrize("name", ["a..b", "a.", ".a", "A", "evil\\n", "x" * 65])
def test_the_config_refuses_a_kind_section_nats_cannot_take(tmp_path: Any, name: str) -> None:
    from scheduler_gateway.daemon.config import ConfigError, load_config

    path = tmp_path / "gateway.toml"
    path.write_text(f'[kinds."{name}"]\nconcurrency = 2\n[kinds."a.b"]\nconcurrency = 1\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, {})
    assert len(info.value.problems) == 1 and names.KIND_RULE in info.value.problems[0], info.value.problems
