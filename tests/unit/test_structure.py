"""Guardrails of the package's shape (issue 51 point 10), read from the code with ``ast`` (nothing is imported):

- no import cycle among the package's modules, ``TYPE_CHECKING`` and function-local imports included (an import
  that only a type checker or one function runs still ties the two modules: a change to either is a change to the
  other, and a newcomer reading one must read the other);
- no reach into another object's or module's private attribute (``x._name`` where ``x`` is not ``self`` or
  ``cls``; ``self._a._b`` counts, ``__dunder__`` does not) outside the modules of ``ALLOWED_REACHES``, each with
  its reason.

The rules are the ones ``structure.py`` (the figures of issue 51) counts by: an edge from a module to each of our
modules it imports (``from p import m`` to ``p.m`` when ``m`` is a module, else to ``p``), the cycles as the
strongly connected components of more than one module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import scheduler_gateway

ROOT = Path(scheduler_gateway.__file__).parent
PKG = "scheduler_gateway"

#: The modules that may touch another object's underscore names, and why. Nothing else may.
ALLOWED_REACHES = {
    # nats-py has no public call that takes a formatted PUB command: the publisher writes to the client's buffer
    # through these internals (each named there with what breaks on an upgrade, and a fallback to publish)
    "scheduler_gateway.daemon.nats.nats_internals": "nats-py's outgoing buffer (publisher.py's fast path)",
    # ``os._exit`` is public, documented API (the underscore means "without cleanup"); the one call of it
    "scheduler_gateway.hard_exit": "os._exit: end the process at once, as a crash would",
}


def modules() -> dict[str, tuple[Path, bool]]:
    """Every module of the package: its dotted name -> (file, whether it is a package's ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in ROOT.rglob("*.py"):
        parts = [PKG, *path.relative_to(ROOT).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _ours(name: str | None, mods: dict[str, tuple[Path, bool]]) -> str | None:
    """The module of ours that ``name`` is or lies in (``p.m.Class`` -> ``p.m``); None when not ours."""
    while name and name not in mods:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str, tree: ast.AST, is_package: bool, mods: dict[str, tuple[Path, bool]]) -> set[str]:
    """Our modules that ``module`` imports anywhere in its text (top level, under TYPE_CHECKING, in a function)."""
    base = module if is_package else module.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(t for a in node.names if (t := _ours(a.name, mods)))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                source = ".".join(parts) + ("." + node.module if node.module else "")
            else:
                source = node.module or ""
            for a in node.names:
                candidate = f"{source}.{a.name}"
                t = _ours(candidate if candidate in mods else source, mods)
                if t:
                    out.add(t)
    out.discard(module)
    return out


def graph(mods: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    return {m: imports(m, ast.parse(path.read_text()), pkg, mods) for m, (path, pkg) in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def reaches(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, text)`` of each access to an underscore attribute of anything but ``self``/``cls``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            yield node.lineno, ast.unparse(node)


# -- the checks' own rules, on snippets (so each can fail) --------------------------------------------------------


def test_the_graph_counts_type_checking_local_and_relative_imports() -> None:
    mods = {f"{PKG}.a": (Path("a.py"), False), f"{PKG}.b": (Path("b.py"), False), f"{PKG}.p": (Path("p"), True)}
    mods[f"{PKG}.p.c"] = (Path("p/c.py"), False)
    code = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from scheduler_gateway.b import B\n"
        "def f():\n    from .p import c\n    import scheduler_gateway.p.c as cc\n"
    )
    assert imports(f"{PKG}.a", ast.parse(code), False, mods) == {f"{PKG}.b", f"{PKG}.p.c"}
    assert imports(f"{PKG}.p.c", ast.parse("from .. import a\nfrom . import Thing\n"), False, mods) == {
        f"{PKG}.a",
        f"{PKG}.p",
    }
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_a_reach_is_any_underscore_attribute_but_of_self_or_cls() -> None:
    code = "self._a\ncls._b\nx._c\nself._d._e\nx.__len__\nos._exit(1)\n"
    assert [text for _, text in reaches(ast.parse(code))] == ["x._c", "self._d._e", "os._exit"]


# -- the package -------------------------------------------------------------------------------------------------


def test_no_import_cycle() -> None:
    found = cycles(graph(modules()))
    assert not found, "import cycles (TYPE_CHECKING and function-local imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_no_private_reach_outside_the_adapter() -> None:
    outside = [
        f"{module}:{line} {text}"
        for module, (path, _) in sorted(modules().items())
        if module not in ALLOWED_REACHES
        for line, text in reaches(ast.parse(path.read_text()))
    ]
    assert not outside, "reaches into another object's private attributes:\n" + "\n".join(outside)


def test_each_allowed_module_is_there_and_still_needs_it() -> None:
    """An allowance outlives its reason unnoticed unless the module still reaches: drop it from the list then."""
    mods = modules()
    for module in ALLOWED_REACHES:
        assert module in mods, f"{module} is gone: drop it from ALLOWED_REACHES"
        assert list(reaches(ast.parse(mods[module][0].read_text()))), f"{module} reaches nothing any more"
