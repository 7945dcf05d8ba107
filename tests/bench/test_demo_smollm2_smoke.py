"""The SmolLM2 demo script keeps working: ``--smoke`` trains the tiny model for 2 iterations
through the GRPO flow, reads the metrics back from storage, prints one table row per
iteration and writes the plot. Figures are not checked (2 tiny steps mean nothing)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]


def test_demo_smoke_plots_every_iteration(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    result = subprocess.run(
        [sys.executable, "bench/demo_smollm2.py", "--smoke", "--out", str(plot)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| [-\d.e]+ \|", result.stdout, flags=re.MULTILINE)
    assert rows == ["0", "1"], result.stdout[-3000:]
    assert "2 iterations" in result.stdout
    assert plot.stat().st_size > 10_000  # a rendered PNG, not an empty file
    assert "not recorded in bench/RESULTS.md" in result.stdout
