"""Artifacts on the wire (docs/WIRE.md, Artifacts; docs/ARTIFACTS.md): the node's begin / commit / put / abort
requests on ``gw.artifact.<nodeId>``, the bucket's subjects, the name rule and the HTTP view.

How bytes travel: an artifact of at most ``INLINE_MAX`` bytes goes in one ``put`` request, its bytes inside:
the gateway hashes them, stores them as one chunk and records them. A bigger one: the node asks to begin (the
gateway checks the lease, the name and the limits and hands out an upload id), publishes the bytes itself, in
chunks, to JetStream on ``$O.GW_ARTIFACTS.C.<nodeId>.<uploadId>`` (the only chunk subjects its NATS user may
publish to), then asks to commit with the size and sha256 it computed as it sent them. The gateway reads the
stored chunks back, checks size and digest, writes the object's meta (the object store's own format, so ``nats
object`` tools see it) and records the index row in the store. A node can never read, purge or delete anything
in the bucket, nor write meta: only the gateway can.
"""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

#: the JetStream object store bucket of every artifact, and its stream (``OBJ_<bucket>``)
BUCKET: Final = "GW_ARTIFACTS"
BUCKET_STREAM: Final = f"OBJ_{BUCKET}"
#: the chunk size the gateway hands out when the server allows it (the last chunk of an upload is shorter)
DEFAULT_CHUNK_SIZE: Final = 1024 * 1024
#: the most bytes a ``put`` request carries inline (base64 in the JSON: a third more on the wire)
INLINE_MAX: Final = 64 * 1024
NAME_MAX: Final = 255
# every pattern here matches the whole string (``\A...\Z``, fullmatch): ``$`` also matches before a final
# newline, and a name or a type with one would reach a subject, a file name or an HTTP header
_NAME_RE = re.compile(r"\A[A-Za-z0-9._/-]{1,255}\Z")
_UPLOAD_RE = re.compile(r"\A(?:upl_[A-Za-z0-9]{1,64})\Z")
SHA256_PATTERN: Final = r"\A[0-9a-f]{64}\Z"
CONTENT_TYPE_MAX: Final = 255
# RFC 9110 8.3.1: type "/" subtype *( OWS ";" OWS [ name "=" ( token / quoted-string ) ] ), printable ASCII
# only (no control character, no tab, nothing that cannot stand in a Content-Type header as it is)
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_QUOTED = r'"(?:[ !#-\[\]-~]|\\[ -~])*"'
_CONTENT_TYPE_RE = re.compile(rf"\A{_TOKEN}/{_TOKEN}(?: *;(?: *{_TOKEN}=(?:{_TOKEN}|{_QUOTED}))?)*\Z")
DEFAULT_CONTENT_TYPE: Final = "application/octet-stream"


def name_problem(name: str) -> str | None:
    """Why ``name`` is not a valid artifact name (CONTRACT 2.11), or None: 1..255 characters of
    ``[A-Za-z0-9._/-]``, no leading ``/``, no empty, ``.`` or ``..`` segment."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        return "an artifact name is 1 to 255 characters of A-Z a-z 0-9 . _ / -"
    if name.startswith("/"):
        return "an artifact name does not start with /"
    if any(seg in ("", ".", "..") for seg in name.split("/")):
        return "an artifact name has no empty, '.' or '..' segment"
    return None


def content_type_problem(content_type: str) -> str | None:
    """Why ``content_type`` is not a media type valid as an HTTP ``Content-Type`` (``type/subtype`` with optional
    ``; name=value`` parameters, value a token or a quoted string; printable ASCII, at most 255), or None."""
    if not isinstance(content_type, str) or len(content_type) > CONTENT_TYPE_MAX:
        return "contentType is a media type such as text/plain or application/json; charset=utf-8"
    if not _CONTENT_TYPE_RE.fullmatch(content_type):  # a tab, a newline, a stray quote: never a header value
        return "contentType is a media type such as text/plain or application/json; charset=utf-8"
    return None


def upload_id_ok(upload_id: str) -> bool:
    return isinstance(upload_id, str) and bool(_UPLOAD_RE.fullmatch(upload_id))


def chunk_token(node_id: str, upload_id: str) -> str:
    """The object store's ``nuid`` of an upload: ``<nodeId>.<uploadId>`` (two subject tokens)."""
    return f"{node_id}.{upload_id}"


def chunk_subject(node_id: str, upload_id: str) -> str:
    """Where a node publishes the chunks of one upload: ``$O.GW_ARTIFACTS.C.<nodeId>.<uploadId>``."""
    return f"$O.{BUCKET}.C.{chunk_token(node_id, upload_id)}"


def node_chunk_subjects(node_id: str) -> str:
    """Every chunk subject node ``node_id`` may publish to (``*`` for the dev user: any node)."""
    return f"$O.{BUCKET}.C.{node_id}.>"


def object_name(task_id: str, name: str) -> str:
    """The object's name in the bucket: ``<taskId>/<artifact name>``."""
    return f"{task_id}/{name}"


class _Wire(msgspec.Struct, rename="camel", kw_only=True, omit_defaults=True):
    pass


Sha256 = Annotated[str, Meta(pattern=SHA256_PATTERN)]
Size = Annotated[int, Meta(ge=0)]


class ArtifactBegin(_Wire, tag="begin", tag_field="op"):
    """Ask to upload ``name`` for the task whose lease the node holds. ``size`` and ``sha256`` are optional
    hints: with both, an artifact of that name and digest already recorded answers ``repeat`` at once."""

    task_id: str
    lease_id: str
    name: str
    content_type: str | None = None
    size: Size | None = None
    sha256: Sha256 | None = None


class ArtifactCommit(_Wire, tag="commit", tag_field="op"):
    """The chunks of ``uploadId`` are all published (each acked by JetStream): record them as ``name``."""

    task_id: str
    lease_id: str
    upload_id: str
    name: str
    size: Size
    sha256: Sha256
    content_type: str | None = None


class ArtifactPut(_Wire, tag="put", tag_field="op"):
    """A small artifact in one request: ``data`` (at most ``INLINE_MAX`` bytes, base64 in the JSON) with the
    ``size`` and ``sha256`` the node computed. The gateway checks both against ``data``, stores it as the
    object's one chunk and records it; repeating the request is safe (the same name and digest is a repeat)."""

    task_id: str
    lease_id: str
    name: str
    size: Size
    sha256: Sha256
    data: bytes
    content_type: str | None = None


class ArtifactAbort(_Wire, tag="abort", tag_field="op"):
    """Drop an upload the node gave up on (over a limit, the handler failed): its chunks are purged now."""

    task_id: str
    lease_id: str
    upload_id: str


ArtifactRequest = ArtifactBegin | ArtifactCommit | ArtifactPut | ArtifactAbort


class ArtifactInfo(msgspec.Struct, rename="camel", kw_only=True):
    """What ``ctx.put_artifact`` returns and the ``task.artifact_added`` event carries."""

    name: str
    size: int
    sha256: str
    content_type: str


class ArtifactError(_Wire):
    code: str
    message: str = ""


class ArtifactReply(_Wire):
    """The answer to any artifact request. ``begin``: ``uploadId``, ``subject``, ``chunkSize`` and ``maxBytes``
    (what this upload may still hold), or ``artifact`` with ``repeat: true``. ``commit`` and ``put``: ``artifact`` (with
    ``repeat`` when that name and digest were already recorded). Refused: ``ok: false`` and ``error``."""

    ok: bool
    upload_id: str | None = None
    subject: str | None = None
    chunk_size: int | None = None
    max_bytes: int | None = None
    artifact: ArtifactInfo | None = None
    repeat: bool = False
    error: ArtifactError | None = None


class ArtifactView(msgspec.Struct, rename="camel", kw_only=True):
    """``GET /api/tasks/{id}/artifacts`` items (CONTRACT 2.11)."""

    name: str
    size: int
    sha256: str
    content_type: str
    attempt_no: int
    node_id: str
    created_at: str | None


class ArtifactPage(msgspec.Struct, rename="camel", kw_only=True):
    items: list[ArtifactView]
    next_cursor: str | None = None


Op = Literal["begin", "commit", "put", "abort"]
