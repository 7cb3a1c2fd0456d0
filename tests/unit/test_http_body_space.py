"""A request body of JSON whitespace alone is an empty body; any other byte that JSON refuses is a 400."""

from __future__ import annotations

import msgspec
import pytest

from scheduler_gateway.daemon.http.requests import canonical_hash, decode_body
from scheduler_gateway.wire.errors import GatewayError


class Body(msgspec.Struct):
    name: str = "default"


@pytest.mark.parametrize("body", [b"", b" ", b"\r\n\t "])
def test_json_whitespace_alone_is_an_empty_body(body: bytes) -> None:
    assert decode_body(body, Body) == Body()


@pytest.mark.parametrize("body", [b"\x0b", b"\x0c", b" \x0b ", b"\x1c"])
def test_a_vertical_tab_or_form_feed_is_not_json_and_is_refused(body: bytes) -> None:
    # bytes.strip() takes \x0b and \x0c as whitespace: the thread route took b"\x0b" as {} and answered 201
    with pytest.raises(GatewayError) as err:
        decode_body(body, Body)
    assert err.value.code == "INVALID_ARGUMENT"
    assert canonical_hash(body) != canonical_hash(b"")
