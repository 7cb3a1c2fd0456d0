"""The command line of ``gatewayctl`` (docs/CLI.md): every command of the operator's CLI as an argparse tree.

This module imports nothing heavy (no aiohttp, no client): shell completion runs the program up to the
parser on every <Tab>, so it has to start fast."""

from __future__ import annotations

import argparse
from typing import Any, Final

TASK_STATES: Final = ("waiting_approval", "queued", "running", "succeeded", "failed", "canceled", "dead")
WORKFLOW_STATES: Final = ("running", "succeeded", "failed", "canceled")
DEFAULT_URL: Final = "http://127.0.0.1:8080"
DEFAULT_TOKEN_FILE: Final = "var/admin.token"

EPILOG: Final = f"""\
The URL comes from --url, else GATEWAY_URL, else {DEFAULT_URL}; the token from --token-file, else
GATEWAY_TOKEN, else ./{DEFAULT_TOKEN_FILE} when it exists. Exit status: 0 done, 1 the gateway refused (its
stable code on stderr; a waited-for task that did not succeed), 2 a usage error or no gateway to talk to.
Shell completion: eval "$(gatewayctl completion bash)" (or zsh). docs/CLI.md has the recipes."""


def _globals(parser: argparse.ArgumentParser, *, leaf: bool) -> None:
    """The global options, on the top parser and again on every command (``tasks list --output json`` works
    too); on a command they default to "not given", so they never undo one given before the command."""
    default: Any = argparse.SUPPRESS if leaf else None
    g = parser.add_argument_group("connection and output")
    g.add_argument("--url", default=default, help=f"the gateway's HTTP address (GATEWAY_URL, default {DEFAULT_URL})")
    g.add_argument(
        "--token-file",
        default=default,
        metavar="FILE",
        help=f"a file holding the API token (else GATEWAY_TOKEN, else ./{DEFAULT_TOKEN_FILE})",
    )
    g.add_argument(
        "--output",
        "-O",
        choices=("table", "json"),
        default=default,
        help="table (aligned columns; the default on a terminal) or json (the API's JSON; the default otherwise)",
    )


class _Builder:
    def __init__(self, sub: Any) -> None:
        self.sub = sub

    def leaf(self, name: str, help_: str, **kw: Any) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = self.sub.add_parser(name, help=help_, description=help_, **kw)
        _globals(p, leaf=True)
        return p


def _group(sub: Any, name: str, help_: str) -> _Builder:
    p = sub.add_parser(name, help=help_, description=help_)
    return _Builder(p.add_subparsers(dest="action", required=True, metavar="ACTION"))


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def _limit(text: str) -> int | None:
    """A kind's concurrency limit: a number >= 0, or ``none`` to remove it."""
    if text.lower() in ("none", "null", "off"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (or none)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _rate(text: str) -> tuple[int, float] | None:
    """``N/PERIOD_S`` (at most N starts in any PERIOD_S seconds), or ``none`` to remove the rate."""
    if text.lower() in ("none", "null", "off"):
        return None
    limit, sep, period = text.partition("/")
    try:
        n, s = int(limit), float(period)
    except ValueError:
        n, s = 0, 0.0
    if not sep or n < 1 or not s > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a rate is N/PERIOD_S, e.g. 10/60 (or none)")
    return n, s


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gatewayctl",
        description="The operator's command line of the scheduler gateway, over its HTTP API.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _globals(parser, leaf=False)
    sub = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    _tasks_commands(sub)
    _dlq_commands(sub)
    _schedules_commands(sub)
    _kinds_commands(sub)
    _nodes_commands(sub)
    _artifacts_commands(sub)
    _events_commands(sub)
    _workflows_commands(sub)

    p = sub.add_parser("completion", help="print the shell completion script (bash or zsh)")
    p.add_argument("shell", choices=("bash", "zsh"))
    return parser


def _tasks_commands(sub: Any) -> None:
    tasks = _group(sub, "tasks", "submit, list, read, wait for and act on tasks")
    p = tasks.leaf("submit", "create a task (POST /api/tasks)")
    p.add_argument("kind", metavar="KIND")
    p.add_argument("--payload", metavar="JSON|@FILE", help="the payload as JSON text, or @FILE (@- reads stdin)")
    p.add_argument("--key", metavar="K", help="Idempotency-Key: the same key and body again answers the same task")
    p.add_argument("--priority", type=int, metavar="N", help="higher first (default 0)")
    p.add_argument("--concurrency-key", metavar="K", help="the lane its kind's per-key limits count in")
    p.add_argument("--max-attempts", type=_positive_int, metavar="N")
    p.add_argument("--label", action="append", default=[], metavar="K=V", help="a label (repeatable)")
    p.add_argument("--wait", action="store_true", help="wait until it ends; exit 0 only if it succeeded")
    p.add_argument("--timeout", type=_seconds, metavar="S", help="with --wait: give up after S seconds (exit 1)")
    p = tasks.leaf("list", "list tasks, newest first (pages fetched as they go)")
    p.add_argument("--state", choices=TASK_STATES)
    p.add_argument("--kind", metavar="K")
    p.add_argument("--workflow", metavar="ID", help="only the tasks of this workflow")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N tasks: the N newest (default: all)")
    p.add_argument("--oldest", action="store_true", help="oldest first (--limit N: the N oldest)")
    p.add_argument("--page-size", type=_positive_int, default=100, help=argparse.SUPPRESS)
    tasks.leaf("get", "one task").add_argument("id", metavar="ID")
    tasks.leaf("history", "every transition of a task, oldest first").add_argument("id", metavar="ID")
    for action, what in (
        ("cancel", "cancel a task and its active descendants"),
        ("approve", "approve a task waiting for approval"),
        ("retry", "requeue a failed, dead or canceled task with a fresh attempt budget"),
    ):
        p = tasks.leaf(action, what)
        p.add_argument("id", metavar="ID")
        p.add_argument("--reason", metavar="R", help="why (kept in the history; cancel only)")
    p = tasks.leaf("wait", "wait until a task ends; exit 0 only if it succeeded")
    p.add_argument("id", metavar="ID")
    p.add_argument("--timeout", type=_seconds, metavar="S", help="give up after S seconds (exit 1)")


def _dlq_commands(sub: Any) -> None:
    dlq = _group(sub, "dlq", "dead letters: tasks that ran out of attempts")
    p = dlq.leaf("list", "list dead letters")
    p.add_argument("--exhausted", action="store_true", help="only exhausted letters (no automatic redrive)")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N letters (default: all)")
    p.add_argument("--page-size", type=_positive_int, default=100, help=argparse.SUPPRESS)
    dlq.leaf("retry", "redrive a dead letter's task").add_argument("id", metavar="ID")
    p = dlq.leaf("force-retry", "redrive an exhausted dead letter (recorded with the reason)")
    p.add_argument("id", metavar="ID")
    p.add_argument("--reason", required=True, metavar="R")


def _schedules_commands(sub: Any) -> None:
    schedules = _group(sub, "schedules", "scheduled tasks (cron and one-shot)")
    schedules.leaf("list", "list scheduled tasks").add_argument(
        "--page-size", type=_positive_int, default=100, help=argparse.SUPPRESS
    )
    schedules.leaf("get", "one scheduled task").add_argument("id", metavar="ID")
    for action, what in (
        ("pause", "pause a schedule"),
        ("resume", "resume a paused schedule"),
        ("trigger", "start a run now"),
        ("delete", "delete a schedule (its tasks stay)"),
    ):
        schedules.leaf(action, what).add_argument("id", metavar="ID")
    p = schedules.leaf("create", "create a schedule: a cron (--cron) or one run at a time (--at)")
    p.add_argument("--kind", required=True, metavar="K", help="the kind of the tasks it starts")
    p.add_argument("--payload", metavar="JSON|@FILE", help="the tasks' payload as JSON text, or @FILE (@- reads stdin)")
    when = p.add_mutually_exclusive_group(required=True)
    when.add_argument("--cron", metavar="EXPR", help='a cron expression, e.g. "*/5 * * * *"')
    when.add_argument("--at", metavar="TIME", help="once, at this RFC 3339 time, e.g. 2030-01-01T09:00:00Z")
    p.add_argument("--timezone", metavar="TZ", help="the cron's time zone, e.g. Europe/Paris (default UTC)")
    p.add_argument("--title", metavar="T")
    p = schedules.leaf("runs", "a schedule's runs")
    p.add_argument("id", metavar="ID")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N runs (default: all)")
    p.add_argument("--page-size", type=_positive_int, default=100, help=argparse.SUPPRESS)
    p = schedules.leaf("upcoming", "a schedule's next fire times")
    p.add_argument("id", metavar="ID")
    p.add_argument("--count", type=_positive_int, metavar="N", help="how many (1 to 100; default the API's)")


def _kinds_commands(sub: Any) -> None:
    kinds = _group(sub, "kinds", "kinds: their flow limits, counts and pause switch")
    kinds.leaf("list", "every kind with tasks or settings")
    kinds.leaf("get", "one kind").add_argument("kind", metavar="KIND")
    p = kinds.leaf("set", "change a kind's limits (admin); none removes a limit")
    p.add_argument("kind", metavar="KIND")
    p.add_argument(
        "--concurrency", type=_limit, default=argparse.SUPPRESS, metavar="N", help="at most N running at once"
    )
    p.add_argument(
        "--key-concurrency",
        type=_limit,
        default=argparse.SUPPRESS,
        metavar="N",
        help="at most N running per concurrency key",
    )
    p.add_argument(
        "--rate",
        type=_rate,
        default=argparse.SUPPRESS,
        metavar="N/PERIOD_S",
        help="at most N starts in any PERIOD_S seconds",
    )
    p.add_argument(
        "--key-rate", type=_rate, default=argparse.SUPPRESS, metavar="N/PERIOD_S", help="the same, per concurrency key"
    )
    kinds.leaf("pause", "start nothing more of a kind (running tasks go on)").add_argument("kind", metavar="KIND")
    kinds.leaf("resume", "start a paused kind's queue again").add_argument("kind", metavar="KIND")


def _nodes_commands(sub: Any) -> None:
    nodes = _group(sub, "nodes", "node workers")
    nodes.leaf("list", "every node the gateway knows")
    nodes.leaf("drain", "no new claims for a node; its running tasks go on").add_argument("id", metavar="ID")
    nodes.leaf("undrain", "let a drained node claim again").add_argument("id", metavar="ID")


def _artifacts_commands(sub: Any) -> None:
    artifacts = _group(sub, "artifacts", "files a task's handler attached")
    artifacts.leaf("list", "a task's artifacts").add_argument("task_id", metavar="TASK_ID")
    p = artifacts.leaf("get", "download an artifact (to stdout, or -o FILE)")
    p.add_argument("task_id", metavar="TASK_ID")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-o", dest="out", metavar="FILE", help="write it to FILE (default: stdout)")


def _events_commands(sub: Any) -> None:
    events = _group(sub, "events", "the event stream")
    p = events.leaf("tail", "print events as they come until interrupted; resumes by itself after a cut")
    p.add_argument("--types", metavar="T1,T2", help="only these event types (comma-separated)")
    p.add_argument("--from-seq", type=_positive_int, metavar="N", help="replay from seq N first, then go live")
    p.add_argument("--aggregate-id", metavar="ID", help="only events of this object (a task id...)")


def _workflows_commands(sub: Any) -> None:
    workflows = _group(sub, "workflows", "workflows: graphs of tasks that wait for other tasks")
    p = workflows.leaf("submit", "create a workflow from FILE, the JSON body of POST /api/workflows (- reads stdin)")
    p.add_argument("file", metavar="FILE|-")
    p.add_argument("--key", metavar="K", help="Idempotency-Key: the same key and body again answers the same workflow")
    p.add_argument("--wait", action="store_true", help="wait until it finishes; exit 0 only if it succeeded")
    p.add_argument("--timeout", type=_seconds, metavar="S", help="with --wait: give up after S seconds (exit 1)")
    p = workflows.leaf("list", "list workflows, newest first (pages fetched as they go)")
    p.add_argument("--state", choices=WORKFLOW_STATES)
    p.add_argument("--name", metavar="N", help="only workflows of this name")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="at most N workflows: the N newest (default: all)")
    p.add_argument("--page-size", type=_positive_int, default=100, help=argparse.SUPPRESS)
    workflows.leaf("get", "one workflow and a table of its tasks (what each waits for, or its error)").add_argument(
        "id", metavar="ID"
    )
    p = workflows.leaf("cancel", "cancel every task of a workflow that has not ended")
    p.add_argument("id", metavar="ID")
    p.add_argument("--reason", metavar="R", help="why (kept in the tasks' history and the audit)")
    p = workflows.leaf("retry", "run again what failed (or the tasks named by --ref) and what did not succeed after it")
    p.add_argument("id", metavar="ID")
    p.add_argument("--ref", action="append", dest="refs", metavar="R", help="a task's ref to run again (repeatable)")
    p = workflows.leaf("wait", "wait until a workflow finishes; exit 0 only if it succeeded")
    p.add_argument("id", metavar="ID")
    p.add_argument("--timeout", type=_seconds, metavar="S", help="give up after S seconds (exit 1)")
