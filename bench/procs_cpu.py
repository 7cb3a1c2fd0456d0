"""CPU time of a process tree, for the benchmarks' CPU split by process group.

This module owns one thing: how much CPU a whole tree of processes has used, read from ``/proc``. PostgreSQL
runs a postmaster and one backend process per connection (plus its checkpointer, WAL writer, autovacuum...):
its CPU is the sum over that tree, and a backend that ended inside the measured window still counts, through
its parent's ``cutime``/``cstime`` (the CPU of the children it has reaped). So the tree's CPU at a moment is

    root's utime + stime + cutime + cstime  +  utime + stime of every live descendant

and the difference of two samples is what the tree spent between them, backends come and gone included. A
descendant that exits and is reaped between the samples moves from the second term into the first, without
being counted twice. (A reaped grandchild lands in its own parent's ``cutime``, which is not summed: a
postgres backend forks nothing, so the tree is two levels deep.)
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def stat_fields(pid: int, proc: Path = PROC) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3, the state, is index 0); None when the
    process is gone. The name is cut at the last ``)``: it may hold spaces and parentheses itself."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return text.rsplit(")", 1)[1].split()


def own_cpu_s(fields: list[str]) -> float:
    """utime + stime (all threads) in seconds, from ``stat_fields``."""
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def reaped_children_cpu_s(fields: list[str]) -> float:
    """cutime + cstime: the CPU of the children this process has waited for, in seconds."""
    return (int(fields[13]) + int(fields[14])) / CLK_TCK


def parents(proc: Path = PROC) -> dict[int, int]:
    """pid -> parent pid of every process visible in ``/proc`` (one read of each stat file)."""
    out: dict[int, int] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            fields = stat_fields(int(entry.name), proc)
            if fields is not None:
                out[int(entry.name)] = int(fields[1])
    return out


def descendants(root: int, parent_of: Mapping[int, int]) -> set[int]:
    """Every process below ``root`` (children, their children...), from a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parent_of.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(children.get(root, ()))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def tree_cpu_s(root: int | None, proc: Path = PROC) -> float:
    """The CPU seconds of ``root`` and its tree so far (the module doc); NaN when ``root`` is gone."""
    if root is None:
        return float("nan")
    fields = stat_fields(root, proc)
    if fields is None:
        return float("nan")
    total = own_cpu_s(fields) + reaped_children_cpu_s(fields)
    for pid in descendants(root, parents(proc)):
        child = stat_fields(pid, proc)
        if child is not None:  # gone since the listing: its CPU is in the root's cutime once reaped
            total += own_cpu_s(child)
    return total


def pids_cpu_s(pids: Iterable[int | None], proc: Path = PROC) -> float:
    """utime + stime of each listed process (its threads, not its children), summed; NaN if one is gone."""
    total = 0.0
    for pid in pids:
        fields = None if pid is None else stat_fields(pid, proc)
        if fields is None:
            return float("nan")
        total += own_cpu_s(fields)
    return total
