"""Artifact names and content types match as whole strings (issue 49 point 7; CONTRACT 2.11, docs/ARTIFACTS.md):
a final newline, a control character or a 256th character is refused by the wire rules, and the worker SDK
refuses such a name or type before it sends anything."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler_gateway.wire.artifacts import CONTENT_TYPE_MAX, content_type_problem, name_problem, upload_id_ok
from scheduler_gateway.worker import ArtifactRefused
from scheduler_gateway.worker._artifacts import ArtifactLink, Uploader

NAMES = st.from_regex(re.compile(r"\A[A-Za-z0-9_-]{1,20}(/[A-Za-z0-9._-]{0,10}[A-Za-z0-9_-])?\Z"))
TOKEN = st.from_regex(re.compile(r"\A[A-Za-z0-9!#$&^_.+-]{1,12}\Z"))
TYPES = st.builds(lambda a, b: f"{a}/{b}", TOKEN, TOKEN)
#: what a header line cannot carry as it is: control characters (a final newline among them), DEL, non-ASCII
BAD_TAILS = st.sampled_from(["\n", "\r\n", "\r", "\x00", "\t", "\x7f", "\x1b", "é", " "])


@given(NAMES, BAD_TAILS)
def test_a_valid_name_with_a_bad_character_after_it_is_refused(name: str, tail: str) -> None:
    assert name_problem(name) is None
    assert name_problem(name + tail) is not None
    assert name_problem(tail + name) is not None


@given(TYPES, BAD_TAILS)
def test_a_valid_content_type_with_a_bad_character_after_it_is_refused(ctype: str, tail: str) -> None:
    assert content_type_problem(ctype) is None
    assert content_type_problem(ctype + "; charset=utf-8") is None
    assert content_type_problem(ctype + tail) is not None
    assert content_type_problem(ctype + "; charset=utf-8" + tail) is not None
    if tail != " ":  # a space may stand inside a quoted string; nothing else of these
        assert content_type_problem(f'{ctype}; name="a{tail}b"') is not None


def test_the_limits_and_shapes() -> None:
    assert name_problem("a" * 255) is None and name_problem("a" * 256) is not None
    assert name_problem("a" * 255 + "\n") is not None
    assert content_type_problem("a/" + "b" * (CONTENT_TYPE_MAX - 2)) is None
    assert content_type_problem("a/" + "b" * (CONTENT_TYPE_MAX - 1)) is not None
    for ok in ("text/plain", "text/plain;", "text/plain; charset=utf-8", 'a/b;x="q \\" t"', "image/svg+xml"):
        assert content_type_problem(ok) is None, ok
    for bad in ("text", "text/", "/plain", "text/plain ", "text/plain; charset", "a/b; x=y z", 'a/b; x="open'):
        assert content_type_problem(bad) is not None, bad
    assert upload_id_ok("upl_abc") and not upload_id_ok("upl_abc\n") and not upload_id_ok("upl_")


async def _never(*args: Any, **kwargs: Any) -> bytes:
    raise AssertionError("the SDK sent a request for an artifact it should have refused")


#: a link whose connection must never be used: the SDK refuses before sending
_NO_NATS = ArtifactLink(request=_never, publish=_never, reconnected=asyncio.Event)


@pytest.mark.parametrize(
    ("name", "content_type"),
    [("a.txt\n", None), ("x" * 255 + "\n", None), ("a.txt", "text/plain\n"), ("a.txt", "text/plain; a=b\r\nX: y")],
)
async def test_the_worker_sdk_refuses_such_a_name_or_type_before_sending(name: str, content_type: str | None) -> None:
    uploader = Uploader(_NO_NATS, "tsk_x", "lse_x")
    with pytest.raises(ArtifactRefused) as refused:
        await uploader.put(name, b"data", content_type)
    assert refused.value.code == "INVALID_ARGUMENT"
