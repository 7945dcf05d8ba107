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


def test_scale_model_smoke() -> None:
    out = run_smoke("scale_model.py")
    assert re.search(
        r"floor \(unbounded workers, ranks where they pay; using [a-z -]+\): \d+\.\d\d s", out
    )
    assert re.search(r"train on 2 / 8 ranks pays from (\d+|inf) / (\d+|inf) sequences", out)


def test_vs_trl_smoke(trl_python: Path | None) -> None:
    """One seed at the smallest size: the speed row, each
    side's reward rise (one seed: no standard error) and its per-seed rise. The summary over
    several seeds is checked on hand figures (test_vs_trl_summary.py). Where TRL's venv is
    not built (`make bench-venvs`; under CI the fixture builds it, so CI always runs TRL),
    our side alone. TRL runs its plain mode only: the vLLM colocate mode (two thirds of this
    smoke's time) differs from it by TRL's own vLLM generation with the bench's patch, which
    test_trl_vllm_colocate.py runs and checks (its engine generates after the weight sync)."""
    trl = ["--trl-python", str(trl_python), "--trl-modes", "plain"] if trl_python else None
    out = run_smoke("vs_trl.py", "--seeds", "1", *(trl or ["--without-trl"]))
    # TRL's plain mode: its seconds per step and its ratio to ours.
    trl_cells = r"\d+\.\d\d\s+\d+\.\d\d" if trl else r"-\s+-"
    assert re.search(rf"^tiny-llama 1\s+\d+\.\d\d\s+{trl_cells}\s", out, re.MULTILINE)
    rise = r"\d\.\d{3} -> \d\.\d{3}: [-+]\d\.\d{3} \+- nan; per seed \[[-+]\d\.\d{3}\] "
    for side in ["ours \\(Prefect flow\\)", *(["TRL GRPOTrainer"] if trl else [])]:
        assert re.search(rf"^tiny-llama\s+{side}\s+{rise}", out, re.MULTILINE), out[-3000:]
    assert "reward per step (per seed [1]): " in out


# learning_smollm2.py's row of a seed, after the seed and its SFT seed: start, end, gain,
# 2 steps, s/step, wall minutes.
SEED_ROW_CELLS = r"\d\.\d{3}\s+\d\.\d{3}\s+[-+]\d\.\d{3}\s+2\s+\d+\s+\d+\.\d"
# The benchmarks that load torch run in one process (tests/bench/smoke_runner.py): each
# alone would pay its imports again. The issue-8 scripts' smokes say that they recorded
# nothing. learning.py comes last: it trains with Megatron-core in this process.
SHARED_PROCESS = {
    "storage.py": [rf"local disk, arrow file\s+read\s.*\s{RATIO}\s+{RATIO}$"],
    "codec_cut.py": [rf"^32 x 40: mask .*, mask/rows wall {RATIO}$"],
    "train.py": [rf"tiny \(2x64\)\s+{RATIO}\s+{RATIO}\s+{RATIO}$"],
    "loss_functions.py": [rf"ClippedPGLossFn fwd\+bwd .* ratio {RATIO}"],
    "roofline.py": [
        r"train step\s.*\d\.\d%\s+\d+%",
        r"logprob stage\s.*\d\.\d%\s+\d+%",
        "not recorded in bench/RESULTS.md",
    ],
    "generation.py": [rf"\| 4 \| none \| \d+ \| \d+ \| {RATIO}x \|"],
    "scaling.py": [
        r"fitted exponent k \(time ~ n\^k\): total -?\d+\.\d\d",
        "not recorded in bench/RESULTS.md",
    ],
    "async.py": [
        rf"async k=1, all cores each side\s+\d+\s+{RATIO}\s+{RATIO}x",
        rf"perfect overlap could reach {RATIO}x: sync.s step",
        "not recorded in bench/RESULTS.md",
    ],
    # A GRPO seed from another seed's SFT warm start (--sft-seed): the start is that seed's
    # SFT run, both ends are scored, and the tables name the start's seed; won and lost.
    "learning_smollm2.py": [
        rf"^ours\s+2\s+1\s+{SEED_ROW_CELLS}$",
        r"^ours\s+2\s+\d+\s+\d+$",
        r"^\s+2 held-out, GRPO \(end\)\s+\d\.\d{3}",
        "not recorded in bench/RESULTS.md",
    ],
    # The GPU check's iteration on CPU (tiny model, vLLM-CPU): the figures the GPU run reports.
    "gpu_check.py": [
        r"^flow iteration 0: \d+\.\d s wall; .*generate \d+\.\d\d",
        r"^refit: \d+\.\d{3} s ",
        r"^generate: \d+ tokens in \d+\.\d\d s = \d+ tokens/s$",
        r"^train: \d+ tokens in \d+\.\d\d s = \d+ tokens/s$",
        "not recorded in bench/RESULTS.md",
    ],
    # The SmolLM2 demo's smoke (tiny model, 2 iterations): one table row per iteration read
    # back from storage, and the plot (test_demo_smoke_plots_every_iteration).
    "demo_smollm2.py": ["2 iterations", "not recorded in bench/RESULTS.md"],
    "learning.py": [
        r"^hf gain over 1 seeds: [-+]\d\.\d{3} \+- 0\.000$",
        r"^megatron\s+42\s+\d\.\d{3}",
        "not recorded in bench/RESULTS.md",
    ],
}
# Arguments after --smoke; {out} is the runner's folder for what the scripts write.
SHARED_ARGS = {
    "learning_smollm2.py": "--seeds 2 --sft-seed 1",
    "demo_smollm2.py": "--out {out}/demo.png",
}


@pytest.fixture(scope="module")
def smoke_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("smokes")


@pytest.fixture(scope="module")
def shared_process_smokes(smoke_folder: Path) -> dict[str, tuple[str, str]]:
    """Each ``SHARED_PROCESS`` script's status and ``--smoke`` output, from one runner."""
    commands = [
        f"{script} {SHARED_ARGS.get(script, '').format(out=smoke_folder)}".strip()
        for script in SHARED_PROCESS
    ]
    result = subprocess.run(
        [sys.executable, "tests/bench/smoke_runner.py", *commands],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    sections = re.findall(
        r"^SMOKE_BEGIN (\S+)\n(.*?)^SMOKE_END \1 (\S+) [\d.]+$",
        result.stdout,
        re.MULTILINE | re.DOTALL,
    )
    found = {script: (status, out) for script, out, status in sections}
    lost = f"not run: the runner exited {result.returncode}: {result.stderr[-3000:]}"
    return {script: found.get(script, (lost, "")) for script in SHARED_PROCESS}


@pytest.mark.timeout(1800)  # the first one waits for the runner's whole run
@pytest.mark.xdist_group("bench-shared-process")  # one worker runs the runner, once
@pytest.mark.parametrize("script", SHARED_PROCESS)
def test_shared_process_bench_smoke(
    script: str, shared_process_smokes: dict[str, tuple[str, str]]
) -> None:
    """The component benchmarks (storage, codec, training, losses, roofline, generation),
    scaling, async against sync, the GPU check and the SmolLM2 demo on CPU, and learning
    (the embedded default's; SmolLM2's)."""
    status, out = shared_process_smokes[script]
    assert status == "ok", out[-3000:] + status
    for expected in SHARED_PROCESS[script]:
        assert re.search(expected, out, re.MULTILINE), out[-3000:]


@pytest.mark.timeout(1800)
@pytest.mark.xdist_group("bench-shared-process")
def test_demo_smoke_plots_every_iteration(
    shared_process_smokes: dict[str, tuple[str, str]], smoke_folder: Path
) -> None:
    """The SmolLM2 demo script's ``--smoke`` trains the tiny model for 2 iterations through
    the GRPO flow, reads the metrics back from storage, prints one table row per iteration
    and writes the plot. Figures are not checked (2 tiny steps mean nothing)."""
    status, out = shared_process_smokes["demo_smollm2.py"]
    rows = re.findall(r"^\| (\d+) \| [-\d.e]+ \|", out, flags=re.MULTILINE)
    assert status == "ok" and rows == ["0", "1"], out[-3000:] + status
    assert (smoke_folder / "demo.png").stat().st_size > 10_000  # a rendered PNG, not empty


def test_environments_smoke() -> None:
    """The environments' benchmark, in its own process: its worker pools and sandboxed
    judges start from a process that has loaded nothing else."""
    expected = rf"^\s+2(\s+{RATIO}){{5}}$\nthrough CodeEnvironment.step, 2 workers: {RATIO}"
    assert re.search(expected, run_bench_smoke("environments.py"), re.MULTILINE)
