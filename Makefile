# The README's two commands: `make run` (daemon + embedded NATS + demo worker) and `make test` (everything).
# Both build .venv from a fresh clone with the pinned versions in constraints.txt.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# two stamps: `make run` needs the package and its runtime dependencies only (a quick first command);
# `make test` and the other targets add the test tools (pytest, Playwright, schemathesis, hypothesis...) and
# the otel extra the tracing tests use. Each stamp is remade when pyproject.toml or constraints.txt changes.
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run test lint ops-tools unit bench bench-quick bench-peers soak clean

$(RUN_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,otel]'
	touch $(STAMP)

run: $(RUN_STAMP)
	VENV=$(VENV) bash scripts/dev-run.sh

LINTED := src tests $(wildcard bench/*.py)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINTED)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/mypy

# two test processes, a test file each at a time (module fixtures stay in one process): the suite waits on
# servers, leases and browsers more than it computes. The files go out in collection order, longest first
# (tests/conftest.py), not xdist's default of the files with the most tests first
test: lint ops-tools
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# promtool, systemd-analyze and openssl for tests/ops: installed (as root, with apt-get) only when missing
ops-tools:
	sh scripts/ensure-ops-tools.sh

unit: $(STAMP)
	$(PY) -m pytest -q tests/unit tests/test_store_contract.py

# the slow tests, then the deterministic simulation with fresh seeds for SIM_SOAK_SECONDS (default 10 minutes)
SIM_SOAK_SECONDS ?= 600
soak: $(STAMP)
	$(PY) -m pytest -q -m slow --deselect tests/simulation/test_simulation.py::test_simulation_soak
	SIM_SOAK_SECONDS=$(SIM_SOAK_SECONDS) $(PY) -m pytest -q -s -m slow tests/simulation

# the console's screenshots in docs/console/ (docs/CONSOLE.md), taken by its browser tests
screenshots: $(STAMP)
	CONSOLE_SCREENSHOTS=1 $(PY) -m pytest -q -m "" -p no:randomly tests/console/test_console_browser.py tests/console/test_console_operator.py tests/console/test_console_layout.py tests/console/test_console_workflows.py

bench: $(STAMP)
	$(PY) bench/bench_gateway.py --n 20000

bench-quick: $(STAMP)
	$(PY) bench/bench_gateway.py --n 2000 --reps 1

# the gateway, the JetStream floor and the peer (Dramatiq + Redis) in one run, with the ratios. The peer needs
# the bench extra (installed here) and redis-server (apt-get install redis-server); without it, a note and no peer.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev,bench]'
	touch $(BENCH_STAMP)

bench-peers: $(BENCH_STAMP)
	$(PY) bench/bench_gateway.py --n 20000 --peers

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache
