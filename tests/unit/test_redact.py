"""One redaction function (wire.redact.redact_url) for every URL we print: daemon config, check, callback
views and the worker SDK. A NATS token with no password (``nats://TOKEN@host``) is a secret too."""

from __future__ import annotations

import pytest

from scheduler_gateway.wire.redact import redact_url


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://TOKEN@host:4222", "nats://***@host:4222"),
        ("nats://u:p@h", "nats://u:***@h"),
        ("tls://u:p@h1,nats://t@h2", "tls://u:***@h1,nats://***@h2"),
        ("nats://u:p@h1:4222, nats://h2:4222", "nats://u:***@h1:4222,nats://h2:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://h1:4222,nats://h2:4222", "nats://h1:4222,nats://h2:4222"),
        ("nats://u:p%40ss@[::1]:4222", "nats://u:***@[::1]:4222"),
        ("https://u:pw@h.example/p?q=1", "https://u:***@h.example/p?q=1"),
        ("https://h.example/hook?token=abc&x=1", "https://h.example/hook?token=***&x=1"),
        ("https://h.example/hook?api_key=abc&access_token=def", "https://h.example/hook?api_key=***&access_token=***"),
        ("https://h.example/hook?X-Amz-Signature=abc#frag", "https://h.example/hook?X-Amz-Signature=***#frag"),
        ("https://h.example/hook?q=token", "https://h.example/hook?q=token"),
        ("", ""),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_no_secret_survives() -> None:
    for url in (
        "nats://s3cr3t@h",
        "nats://u:s3cr3t@h",
        "tls://u:s3cr3t@h1,nats://s3cr3t@h2",
        "http://h/?password=s3cr3t",
    ):
        assert "s3cr3t" not in redact_url(url)


def test_never_raises() -> None:
    assert redact_url("nats://[bad") == "<unparsable url>"
