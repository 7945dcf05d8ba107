"""The component benchmarks (storage, generation, training, environments, losses) keep
working: each script's ``--smoke`` mode exits 0 and prints its comparison line. Figures are
not checked: timings on a shared machine mean nothing in a test."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RATIO = r"\d+\.\d+"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("storage.py", rf"local disk, arrow file\s+read\s.*\s{RATIO}\s+{RATIO}$"),
        ("generation.py", rf"\| 4 \| none \| \d+ \| \d+ \| {RATIO}x \|"),
        ("train.py", rf"tiny \(2x64\)\s+{RATIO}\s+{RATIO}\s+{RATIO}$"),
        ("environments.py", rf"sandbox runs/s: 1 worker {RATIO}, 2 workers {RATIO}, ratio {RATIO}"),
        ("loss_functions.py", rf"ClippedPGLossFn fwd\+bwd .* ratio {RATIO}"),
    ],
)
def test_component_bench_smoke(script: str, expected: str) -> None:
    result = subprocess.run(
        [sys.executable, f"bench/{script}", "--smoke"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(expected, result.stdout, re.MULTILINE), result.stdout[-3000:]
