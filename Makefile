# Two entry points (README): `make run` trains on the embedded default, `make test` runs the suite.
# Each creates the virtual environment on first use from the lock file.
PYTHON ?= python3.11
VENV ?= .venv
FIND_LINKS ?= /opt/wheels
UV := $(VENV)/bin/uv
PY := $(VENV)/bin/python
RUN_CONFIG ?= examples/configs/grpo_addition_tiny.yaml
PYTEST_ARGS ?=
# Two pytest-xdist workers: the suite spends about half its time waiting (servers starting,
# workers polling, subprocesses), so a second worker fills the idle core; stack tests share
# one worker and one stack (tests/conftest.py). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
# The lock is already resolved (overrides applied by `make lock`): sync installs exactly it.
# Bytecode is compiled at install: where PYTHONDONTWRITEBYTECODE is set (this machine) Python
# would otherwise compile torch, transformers and the rest in every process it starts (every
# flow run, worker and benchmark subprocess), about 8 of the 16 s of `import flows.grpo`.
UV_FLAGS := --python $(PY) --index-strategy unsafe-best-match --compile-bytecode \
	$(if $(wildcard $(FIND_LINKS)),--find-links $(FIND_LINKS))

.PHONY: setup run test lint lock bench-venvs

$(VENV)/.installed: requirements/lock.txt requirements/overrides.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(PY) -m pip install --quiet uv
	$(UV) pip sync $(UV_FLAGS) requirements/lock.txt
	$(UV) pip install $(UV_FLAGS) --no-deps -e .
	touch $@

setup: $(VENV)/.installed

run: setup
	$(PY) -m flows grpo --config $(RUN_CONFIG) $(ARGS)

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup) $(PYTEST_ARGS)

# TRL's own venv for bench/vs_trl.py (its pins must not touch ours); CI builds it so that the
# script's smoke test runs there.
bench-venvs: setup
	$(PY) -c "import sys; sys.path.insert(0, 'bench'); import vs_trl; vs_trl.ensure_trl_venv()"

lock:
	$(UV) pip compile pyproject.toml --all-extras --python-version 3.11 $(if $(wildcard $(FIND_LINKS)),--find-links $(FIND_LINKS)) \
		--override requirements/overrides.txt --index-strategy unsafe-best-match \
		--custom-compile-command "make lock" -o requirements/lock.txt
