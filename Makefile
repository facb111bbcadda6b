# Set-up is two commands: `make demo` and `make test`. Both create the virtual environment first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv lint pyc demo demo-sim test test-fast bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all,test]'
	touch $(STAMP)

# The control plane on an emulated 2-node x 4-GPU cluster: two teams, a mixed workload, shown live.
demo: venv
	$(BIN)/yard demo --out .demo-out

# The scheduler alone: every policy on a synthetic workload in the simulator.
demo-sim: venv
	$(BIN)/yard sim --format synthetic --jobs 400 --cluster 8x8 --policies all --estimates user --seed 1 --out .demo-out/sim

# Lint first (ruff's chosen rules, then mypy: both configured in pyproject.toml), then the suite; the
# layering of docs/design.md is a test of its own (tests/test_architecture.py).
# --dist loadgroup: tests marked xdist_group (a module sharing one cluster) stay on one worker.
# Three workers on this 2-core machine: most tests wait on processes they started (a loop's
# tick, a rank's checkpoint, slurmctld), so a third worker fills the cores they leave idle
# (the suite: 17 min 12 s with -n 3 against 22 min 10 s with -n 2, on the same machine).
# The guards (docs/design.md): ruff, the type checker, and the house rules (layering, sizes, short routers).
lint: venv
	$(BIN)/ruff check src tests bench scripts
	$(BIN)/mypy
	$(BIN)/pytest -q -p no:cacheprovider tests/test_architecture.py

# The suite starts thousands of Python processes (yard commands, planes, jobs): compiled once here,
# their modules load from __pycache__ even where PYTHONDONTWRITEBYTECODE keeps each process from
# writing them (0.1 s less per process; pytest rewrites the test modules itself).
pyc: venv
	$(BIN)/python -m compileall -q src tests bench scripts > /dev/null

# Load-sensitive scenarios (marked solo) run after the rest, alone on the machine: an emulated slow
# node is a CPU quota, which only bites where the unslowed ranks get their CPU (CI's stop 46 ran the
# stragglers scenario beside two other workers: a 16-fold quota made its rank only 2 times slower).
# Both runs always run; the target fails if either did.
test: lint pyc
	$(BIN)/pytest -n 3 --dist loadgroup -q -m "not solo"; rest=$$?; \
	$(BIN)/pytest -q -m solo; solo=$$?; \
	test $$rest -eq 0 && test $$solo -eq 0

test-fast: lint pyc
	$(BIN)/pytest -n 3 --dist loadgroup -q -m "not slow"

bench: venv
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) .demo-out .pytest_cache
