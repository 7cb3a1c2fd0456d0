"""The repo's reference stays in the repo and in step with the code (issue 10): every relative link in
README.md and docs/*.md resolves (file and anchor), nothing points at the shared folder outside the repo,
and every route the admin API registers and every error code is in docs/API.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from scheduler_gateway.daemon.http.app import AdminApi, HttpSettings
from scheduler_gateway.daemon.http.artifacts import ArtifactRoutes
from scheduler_gateway.daemon.http.callbacks import CallbacksApi
from scheduler_gateway.daemon.http.events import EventsApi, SseSettings
from scheduler_gateway.daemon.http.kinds import KindRoutes
from scheduler_gateway.daemon.http.schedules import schedule_routes
from scheduler_gateway.wire.errors import Code

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
API_MD = ROOT / "docs" / "API.md"
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".yml", ".yaml", ".json", ".conf", ".service", ""}

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _links(path: Path) -> list[str]:
    return _LINK.findall(_FENCE.sub("", path.read_text(encoding="utf-8")))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for target in _links(doc):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif not dest.is_relative_to(ROOT):
            broken.append(f"{target}: outside the repo")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, f"{doc.name}: " + "; ".join(broken)


def _repo_text_files() -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in {"Makefile", "Dockerfile"}:
            files.append(path)
    return files


def test_nothing_points_outside_the_repo() -> None:
    needle = "../" + "shared"  # spelled in two parts so this file does not find itself
    found = []
    for path in _repo_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if needle in text:
            found.append(path.relative_to(ROOT).as_posix())
    assert not found, f"{needle} in: {found}"


class _Nothing:
    """Stands in for the services: registering routes only stores bound methods (and hands a route group the
    store's part it uses), it calls nothing."""

    def __getattr__(self, name: str) -> Any:
        if name in ("tasks", "letters", "nodes", "kinds", "search", "artifacts", "callbacks", "schedules"):
            return _Nothing()
        raise AssertionError(f"route registration used {name}")


def _app() -> web.Application:
    """The admin API's app with every extension the gateway installs (``Gateway._route_groups``)."""
    n: Any = _Nothing()
    api = AdminApi(n, n, n, n, n, HttpSettings(), n)
    app = api.app()
    schedule_routes(api.bodies, n)(app)
    EventsApi(n, n, SseSettings()).install(app)
    CallbacksApi(n).install(app)
    ArtifactRoutes(n, n).install(app)
    KindRoutes(api.bodies, n, n, n).install(app)
    return app


def test_every_route_is_in_api_md() -> None:
    text = API_MD.read_text(encoding="utf-8")
    routes = sorted(
        {f"{r.method} {r.resource.canonical}" for r in _app().router.routes() if r.method != "HEAD" and r.resource}
    )
    assert len(routes) > 30
    # the route in code spans, whole: `GET /api/tasks` or `GET /api/tasks?state=`, not a longer path
    missing = [route for route in routes if not re.search(re.escape(f"`{route}") + r"[`? ]", text)]
    assert not missing, f"routes not in docs/API.md: {missing}"


def test_every_error_code_is_in_api_md() -> None:
    text = API_MD.read_text(encoding="utf-8")
    codes = sorted(v for k, v in vars(Code).items() if k.isupper() and isinstance(v, str))
    missing = [code for code in codes if f"`{code}`" not in text]
    assert not missing, f"error codes not in docs/API.md: {missing}"
