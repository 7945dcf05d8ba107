"""The benchmarks keep working: each script's ``--smoke`` mode exits 0 and prints its ratio
lines. Figures are not checked (timings on a shared machine mean nothing here)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
RATIO = r"\d+\.\d+"


def run_bench_smoke(script: str, *args: str) -> str:
    """The script's ``--smoke`` output; fails with its tail when the script fails."""
    result = subprocess.run(
        [sys.executable, f"bench/{script}", "--smoke", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def run_smoke(script: str, *args: str) -> str:
    """An issue-8 script's smoke output, which says that it recorded nothing."""
    out = run_bench_smoke(script, *args)
    assert "not recorded in bench/RESULTS.md" in out
    return out


def test_overhead_smoke() -> None:
    out = run_smoke("overhead.py")
    assert re.search(r"ratio flow-file/plain = \d+\.\d\d", out)
    assert re.search(r"ratio flow-s3/plain = \d+\.\d\d", out)


def test_scaling_smoke() -> None:
    out = run_smoke("scaling.py")
    assert re.search(r"fitted exponent k \(time ~ n\^k\): total -?\d+\.\d\d", out)


def test_learning_smoke() -> None:
    out = run_smoke("learning.py")
    assert re.search(r"^hf gain over 1 seeds: [-+]\d\.\d{3} \+- 0\.000$", out, re.MULTILINE)
    assert re.search(r"^megatron\s+42\s+\d\.\d{3}", out, re.MULTILINE)


def test_scale_model_smoke() -> None:
    out = run_smoke("scale_model.py")
    assert re.search(
        r"floor \(unbounded workers, ranks where they pay; using [a-z -]+\): \d+\.\d\d s", out
    )
    assert re.search(r"train on 2 / 8 ranks pays from (\d+|inf) / (\d+|inf) sequences", out)


def test_roofline_smoke() -> None:
    out = run_smoke("roofline.py")
    assert re.search(r"train step\s.*\d\.\d%\s+\d+%", out)
    assert re.search(r"logprob stage\s.*\d\.\d%\s+\d+%", out)


def test_vs_trl_smoke(trl_python: Path | None) -> None:
    """One seed at the smallest size: the speed row, each
    side's reward rise (one seed: no standard error) and its per-seed rise. The summary over
    several seeds is checked on hand figures (test_vs_trl_summary.py). Where TRL's venv is
    not built (`make bench-venvs`; under CI the fixture builds it, so CI always runs TRL),
    our side alone."""
    with_trl = trl_python is not None
    out = run_smoke("vs_trl.py", "--seeds", "1", *([] if with_trl else ["--without-trl"]))
    # Per TRL mode (plain, vLLM colocate): its seconds per step and its ratio to ours.
    trl_cells = r"\s+".join([r"\d+\.\d\d"] * 4) if with_trl else r"-\s+-"
    assert re.search(rf"^tiny-llama 1\s+\d+\.\d\d\s+{trl_cells}\s", out, re.MULTILINE)
    rise = r"\d\.\d{3} -> \d\.\d{3}: [-+]\d\.\d{3} \+- nan; per seed \[[-+]\d\.\d{3}\] "
    trl_sides = ["TRL GRPOTrainer", "TRL vLLM colocate"] if with_trl else []
    for side in ["ours \\(Prefect flow\\)", *trl_sides]:
        assert re.search(rf"^tiny-llama\s+{side}\s+{rise}", out, re.MULTILINE), out[-3000:]
    assert "reward per step (per seed [1]): " in out


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("storage.py", rf"local disk, arrow file\s+read\s.*\s{RATIO}\s+{RATIO}$"),
        ("generation.py", rf"\| 4 \| none \| \d+ \| \d+ \| {RATIO}x \|"),
        ("train.py", rf"tiny \(2x64\)\s+{RATIO}\s+{RATIO}\s+{RATIO}$"),
        (
            "environments.py",
            rf"^\s+2(\s+{RATIO}){{5}}$\nthrough CodeEnvironment.step, 2 workers: {RATIO}",
        ),
        ("loss_functions.py", rf"ClippedPGLossFn fwd\+bwd .* ratio {RATIO}"),
    ],
    ids=["storage", "generation", "train", "environments", "loss_functions"],
)
def test_component_bench_smoke(script: str, expected: str) -> None:
    """The component benchmarks (storage, generation, training, environments, losses)."""
    assert re.search(expected, run_bench_smoke(script), re.MULTILINE)


def test_async_smoke() -> None:
    out = run_smoke("async.py")
    assert re.search(rf"async k=1, all cores each side\s+\d+\s+{RATIO}\s+{RATIO}x", out)
    assert re.search(rf"perfect overlap could reach {RATIO}x: sync.s step", out)


def test_learning_smollm2_smoke() -> None:
    """A GRPO seed from another seed's SFT warm start (``--sft-seed``): the start is that
    seed's SFT run, both ends are scored, and the tables name the start's seed."""
    out = run_smoke("learning_smollm2.py", "--seeds", "2", "--sft-seed", "1")
    cells = r"\d\.\d{3}\s+\d\.\d{3}\s+[-+]\d\.\d{3}\s+2\s+\d+\s+\d+\.\d"
    assert re.search(rf"^ours\s+2\s+1\s+{cells}$", out, re.MULTILINE), out[-3000:]
    assert re.search(r"^ours\s+2\s+\d+\s+\d+$", out, re.MULTILINE)  # won and lost
    assert re.search(r"^\s+2 held-out, GRPO \(end\)\s+\d\.\d{3}", out, re.MULTILINE)
