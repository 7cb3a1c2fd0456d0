"""``gatewayctl dlq list -O table`` shows each letter's kind and ends with the total (issue 53), as a subprocess
against a real gatewayd (embedded nats-server, SQLite) and a real worker serving ``echo`` and ``fail``."""

from __future__ import annotations

from tests.cli.test_gatewayctl import ctl, ok_json
from tests.cli.test_gatewayctl_first_steps import dead_task, gw  # noqa: F401  (gw: the module's daemon)
from tests.e2e.procs import Daemon


def test_dlq_table_has_a_kind_column_and_a_total(gw: Daemon) -> None:  # noqa: F811
    made = [dead_task(gw, f"death {i}")["id"] for i in range(3)]
    letters = ok_json(ctl(gw, "dlq", "list"))
    assert {d["taskId"]: d["kind"] for d in letters if d["taskId"] in made} == dict.fromkeys(made, "fail")
    table = ctl(gw, "dlq", "list", "-O", "table")
    assert table.returncode == 0, table.stderr
    header, *rows, footer = table.stdout.splitlines()
    assert header.split()[:4] == ["ID", "TASK", "KIND", "REASON"]
    for task_id in made:
        (row,) = [r for r in rows if task_id in r]
        assert row.split()[2] == "fail"
    assert len(rows) == len(letters) and footer == f"total: {len(letters)} dead letters"
    # cut by --limit: it says more match instead of a total; JSON stays the API's array
    cut = ctl(gw, "dlq", "list", "-O", "table", "--limit", "2")
    _, *rows, footer = cut.stdout.splitlines()
    assert len(rows) == 2 and footer == "2 dead letters shown (--limit 2); more match"
    assert len(ok_json(ctl(gw, "dlq", "list", "--limit", "2"))) == 2
    exact = ctl(gw, "dlq", "list", "-O", "table", "--limit", str(len(letters)))
    assert exact.stdout.splitlines()[-1] == f"total: {len(letters)} dead letters"
