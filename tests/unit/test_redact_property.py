"""Issue 18, case 3: no password is printed, whatever characters it has (``,``, ``@``, ``:``, ``/``, ``%``, ``?``,
``#``, unicode, percent-escapes). Checked on every output that carries the store URL: ``redact_one_url``,
``StoreLocation``, the reprs of the config, the gateway settings and the PostgreSQL store, the config errors, and
what ``gatewayd export`` / ``gatewayd import`` print (the last against a PostgreSQL port nobody listens on).

A generated password is framed by a marker, ``MARK + a + MARK + b + MARK``: any piece of it that leaks,
a prefix (the old split at a comma), a suffix (libpq reading a raw ``@`` as the host's start) or its
middle, carries a marker with it."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from unittest import mock
from urllib.parse import quote, unquote, urlsplit

import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import conninfo_to_dict

from scheduler_gateway.daemon.cli import gatewayd_main
from scheduler_gateway.daemon.config import ConfigError, load_config
from scheduler_gateway.daemon.config.model import Config, StoreConfig
from scheduler_gateway.daemon.config.store_url import StoreLocation, StoreUrlError, parse_store_url
from scheduler_gateway.daemon.gateway import GatewaySettings
from scheduler_gateway.daemon.store.postgres import PostgresStore
from scheduler_gateway.daemon.store.postgres.db import PgDb, ScrubUrlSecrets
from scheduler_gateway.daemon.store.sqlite import SqliteStore
from scheduler_gateway.daemon.store.transfer import export_sqlite
from scheduler_gateway.wire.errors import StorageError
from scheduler_gateway.wire.redact import redact_one_url, redact_url

DRIVER_LOGS = ("psycopg", "psycopg.pool")

MARK = "Zq7Wk"
NEXT_SERVER = re.compile(r",\s*[A-Za-z][A-Za-z0-9+.\-]*://")

# printable text, unicode included (no control characters, no lone surrogates), the URL's reserved
# characters drawn often
_chars = st.one_of(
    st.sampled_from(",@:/%?#[]&=;+ !$'()*~"),
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")),
)
_text = st.text(_chars, max_size=12)
#: a password with a marker at both ends and in the middle
framed = st.builds(lambda a, b: f"{MARK}{a}{MARK}{b}{MARK}", _text, _text)
#: as written in a URL: raw, or percent-encoded (every reserved character, or only what quote() escapes)
written = st.sampled_from(["raw", "quoted", "quoted-all"])


def in_url(password: str, form: str) -> str:
    if form == "quoted-all":
        return quote(password, safe="")
    if form == "quoted":
        return quote(password, safe=":,;+!$'()*~")  # sub-delims left raw: still a valid userinfo
    return password


def forms(password: str, shown_as: str) -> set[str]:
    """What of ``password`` must not be printed: its marker, itself, as written, and both en- and decoded."""
    return {MARK, password, shown_as, unquote(shown_as), quote(password, safe=""), quote(password)}


def assert_hidden(password: str, shown_as: str, *outputs: str) -> None:
    for output in outputs:
        for secret in forms(password, shown_as):
            assert secret not in output, (secret, output)


def store_url(shown_as: str, port: int = 5432) -> str:
    return f"postgresql://gw:{shown_as}@127.0.0.1:{port}/gateway?sslmode=disable"


# ---------------------------------------------------------------- redact_one_url / redact_url


@given(password=st.text(_chars, min_size=1))
@example(password="pa,ss")
@example(password="pa@ss")
@example(password="a,postgresql://b")
def test_a_store_url_shows_only_its_user(password: str) -> None:
    for shown_as in (password, quote(password, safe="")):
        url = f"postgresql://gw:{shown_as}@db.example:5432/gateway?sslmode=require"
        assert redact_one_url(url) == "postgresql://gw:***@db.example:5432/gateway?sslmode=require"


@given(password=framed, form=written)
@example(password="pa,ss", form="raw")
@example(password="pa,ss", form="quoted")
def test_the_server_list_form_hides_a_password_with_a_comma(password: str, form: str) -> None:
    url = store_url(in_url(password, form))
    assert_hidden(password, in_url(password, form), redact_url(url), redact_one_url(url))


@given(token=st.text(_chars.filter(lambda c: c != ":"), min_size=1))
def test_a_token_is_hidden_whole(token: str) -> None:
    assert redact_one_url(f"nats://{token}@h:4222") == "nats://***@h:4222"


@given(password=st.text(_chars, min_size=1))
def test_a_password_parameter_is_hidden(password: str) -> None:
    url = f"postgresql://gw@h/gateway?sslmode=require&password={quote(password, safe='')}"
    assert redact_one_url(url) == "postgresql://***@h/gateway?sslmode=require&password=***"


@given(first=st.text(_chars, min_size=1), second=st.text(_chars, min_size=1))
def test_each_server_of_a_list_is_redacted(first: str, second: str) -> None:
    # a password holding ",scheme://" is the one a server list cannot tell from a second server
    assume(not NEXT_SERVER.search(first) and not NEXT_SERVER.search(second))
    url = f"nats://u:{first}@h1:4222, tls://u:{second}@h2:4222,nats://h3:4222"
    assert redact_url(url) == "nats://u:***@h1:4222,tls://u:***@h2:4222,nats://h3:4222"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:pa,ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:pa@ss@h/db", "postgresql://u:***@h/db"),
        ("postgresql://u:p/a?s#s@h/db", "postgresql://u:***@h/db"),
        ("nats://u:pa,ss@h1:4222,nats://t@h2:4222", "nats://u:***@h1:4222,nats://***@h2:4222"),
        ("nats://u:a@b,c@h1:4222,nats://h2:4222", "nats://u:***@h1:4222,nats://h2:4222"),
        ("nats://u:p@h1:4222, tls://u:q@h2:4222", "nats://u:***@h1:4222,tls://u:***@h2:4222"),
        ("nats://h1:4222,nats://h2:4222", "nats://h1:4222,nats://h2:4222"),
        ("nats://a:1,b", "nats://a:1,b"),  # no scheme after the comma: one URL
        # the userinfo ends at the LAST @: an @ after the host hides more than needed, never less
        ("https://tok@h.example:443/p@x", "https://***@x"),
        ("https://h.example/u/me@x/hook", "https://***@x/hook"),
        # a file's path is no userinfo
        ("sqlite:////var/lib/gw@1/gateway.db", "sqlite:////var/lib/gw@1/gateway.db"),
        ("postgresql:///gateway?host=/run/pg&password=pa,ss", "postgresql:///gateway?host=/run/pg&password=***"),
    ],
)
def test_examples(url: str, shown: str) -> None:
    assert redact_url(url) == shown


# ---------------------------------------------------------------- the objects that carry the store URL


@given(password=framed, form=written)
@example(password="pa,ss", form="raw")
def test_no_object_carrying_the_store_url_shows_the_password(password: str, form: str) -> None:
    shown_as = in_url(password, form)
    url = store_url(shown_as)
    location = StoreLocation("postgresql", url)
    config = Config(store=StoreConfig(url=url))  # direct: the URL is not validated
    settings_ = GatewaySettings(data_dir=Path("/var/lib/gw"), nats_url="nats://127.0.0.1:4222", store_url=url)
    store = PostgresStore(url)  # does not connect before start()
    outputs = [
        location.redacted,
        repr(location),
        str(location),
        repr(config),
        str(config),
        repr(config.store),
        str(config.redacted()),
        repr(settings_),
        str(settings_),
        repr(store),
        str(store),
        store.redacted_url,
        repr(PgDb(url)),
    ]
    try:
        parsed = parse_store_url(url)
    except StoreUrlError as exc:
        outputs.append(str(exc))
    else:
        outputs += [repr(parsed), parsed.redacted]
    try:
        loaded = load_config(None, {"GW_STORE_URL": url, "GW_DATA_DIR": "/var/lib/gw"})
    except ConfigError as exc:
        outputs += [str(exc), *exc.problems]
    else:
        outputs += [repr(loaded), str(loaded.redacted()), repr(loaded.store_location)]
    assert_hidden(password, shown_as, *outputs)


@given(password=framed, form=written)
def test_an_accepted_store_url_gives_libpq_the_same_password(password: str, form: str) -> None:
    """A URL libpq would read differently (a raw @ / ? # or a bad %-escape) is refused: libpq's errors, which
    the connection pool logs, would quote the pieces it misread. One accepted gives libpq the password
    redact_one_url hides, and nothing else of it."""
    url = store_url(in_url(password, form))
    try:
        location = parse_store_url(url)
    except StoreUrlError:
        return
    params = conninfo_to_dict(location.url)
    assert params["password"] == unquote(urlsplit(url).password or "")
    assert params["host"] == "127.0.0.1" and params["dbname"] == "gateway" and params["user"] == "gw"


@pytest.mark.parametrize("password", ["pa@ss", "p/ss", "p?ss", "p#ss", "p%zz", "p%00"])
def test_a_raw_reserved_character_is_refused(password: str) -> None:
    with pytest.raises(StoreUrlError) as caught:
        parse_store_url(store_url(password))
    assert password not in str(caught.value)
    assert parse_store_url(store_url(quote(password, safe=""))).kind == "postgresql"


# ---------------------------------------------------------------- gatewayd export / import


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def export_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An export of an empty SQLite store: ``gatewayd import`` reads it, then connects."""
    where = tmp_path_factory.mktemp("transfer")

    async def empty_store() -> None:
        store = SqliteStore(where / "gateway.db")
        await store.start()
        await store.stop()

    asyncio.run(empty_store())
    export_sqlite(where / "gateway.db", where / "export.jsonl")
    return where / "export.jsonl"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=framed, form=written)
@example(password="pa,ss", form="raw")
def test_gatewayd_export_never_prints_the_password(password: str, form: str, tmp_path: Path) -> None:
    shown_as = in_url(password, form)
    out, err = io.StringIO(), io.StringIO()
    env = {"GW_STORE_URL": store_url(shown_as, closed_port()), "GW_DATA_DIR": str(tmp_path)}
    with mock.patch.dict(os.environ, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = gatewayd_main(["export", "--to", str(tmp_path / "never.jsonl")])
    assert code != 0 and err.getvalue()
    assert_hidden(password, shown_as, out.getvalue(), err.getvalue())


# gatewayd itself, in a process of its own (its stderr is where the pool's logged connection errors go), with a
# shorter wait for the pool so that a store nobody answers fails in a second rather than ten. Each example costs
# two processes (a second each, most of it the import): the named cases below plus two drawn ones; the property
# is drawn 40 times over in process by test_gatewayd_export_never_prints_the_password above
RUN_GATEWAYD = """
import functools, sys
import scheduler_gateway.daemon.store.transfer as transfer
transfer.PgDb = functools.partial(transfer.PgDb, connect_timeout_s=0.25)
from scheduler_gateway.daemon.cli import gatewayd_main
raise SystemExit(gatewayd_main(sys.argv[1:]))
"""


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(password=framed, form=written)
@example(password="pa,ss", form="raw")  # the case: refused connection, the URL as libpq reads it
@example(password="pa,ss", form="quoted-all")
@example(password="p@ss", form="raw")  # libpq would take "ss@127.0.0.1" for the host
@example(password="p%zz", form="raw")  # libpq would quote the bad escape
@example(password="p/ss?x#y", form="raw")
@example(password="é,ü:Ω", form="raw")
def test_gatewayd_export_and_import_never_print_the_password(
    password: str, form: str, tmp_path: Path, export_file: Path
) -> None:
    shown_as = in_url(password, form)
    env = {
        **os.environ,
        "GW_STORE_URL": store_url(shown_as, closed_port()),
        "GW_DATA_DIR": str(tmp_path),
        "PYTHONIOENCODING": "utf-8",
    }
    for argv in (["export", "--to", str(tmp_path / "never.jsonl")], ["import", "--from", str(export_file)]):
        done = subprocess.run(
            [sys.executable, "-c", RUN_GATEWAYD, *argv],
            env=env,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="backslashreplace",
            timeout=60,
        )
        assert done.returncode != 0 and done.stderr, done
        assert_hidden(password, shown_as, done.stdout, done.stderr)


@pytest.mark.parametrize(
    "url",
    [
        "POSTGRESQL://gw:Zq7WkSecret@127.0.0.1:{port}/gateway",  # libpq: no URL, quoted whole
        "postgresql://gw:Zq7Wk%zz@127.0.0.1:{port}/gateway",  # the bad escape's token quoted
        "postgresql://gw:Zq7Wk secret@127.0.0.1:{port}/gateway",  # the spaced token quoted
        "postgresql://gw@127.0.0.1:{port}/gateway?password=Zq7Wk%zz",
    ],
)
async def test_what_the_pool_logs_is_scrubbed(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A URL given to PgDb directly is not checked by parse_store_url: the driver's log records of a failed
    connect (libpq quoting what it could not read) are scrubbed of its secrets all the same."""
    db = PgDb(url.format(port=closed_port()), connect_timeout_s=0.5)
    with caplog.at_level(logging.INFO, logger="psycopg"), pytest.raises(StorageError) as caught:
        await db.start()
    assert MARK not in str(caught.value)
    logged = [r for r in caplog.records if r.name.startswith("psycopg")]
    assert logged and all(MARK not in r.getMessage() for r in logged), [r.getMessage() for r in logged]
    assert all(not any(isinstance(f, ScrubUrlSecrets) for f in logging.getLogger(n).filters) for n in DRIVER_LOGS)
