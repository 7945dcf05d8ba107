"""Shared pieces of the reliability suite: a tiny, fast GRPO config (HF generation, two
prompts of two samples), flows in this process or in a killable subprocess that talks to
this process's Prefect API, and the checks that storage holds no half-written object."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from prefect.settings import PREFECT_API_URL
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "configs" / "grpo_math_tiny.yaml"
ITERATIONS = 2
# vLLM adds nothing to a fault test: HF generation, the smallest batch that still trains.
FAST = [
    f"grpo.max_num_steps={ITERATIONS}",
    "policy.generation.backend=hf",
    "grpo.num_prompts_per_step=2",
    "grpo.num_generations_per_prompt=2",
    "policy.train_global_batch_size=4",
    "policy.train_micro_batch_size=4",
    "policy.logprob_batch_size=4",
    "policy.generation.max_new_tokens=8",
    "env.math.num_workers=1",
]


def run_dir(root: Path, run_id: str) -> Path:
    return root / "runs" / run_id


def final_weights(root: Path, run_id: str, step: int = ITERATIONS) -> dict:
    return load_file(
        run_dir(root, run_id) / "checkpoints" / f"step_{step:06d}" / "model.safetensors"
    )


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), f"tensor {name} differs"


def assert_no_half_written_objects(root: Path, run_id: str) -> None:
    """No temporary file anywhere under the run; every manifest output exists whole, with
    the size and sha256 its entry records; every checkpoint directory is COMMITTED."""
    from nemo_rl_core.storage.run_storage import ObjectRef, RunStorage

    base = run_dir(root, run_id)
    leftovers = [p for p in base.rglob("*") if ".tmp-" in p.name]
    assert leftovers == [], f"temporary files left behind: {leftovers}"
    storage = RunStorage(str(root), run_id)
    for manifest_path in base.glob("iter_*/MANIFEST.json"):
        stages = json.loads(manifest_path.read_text())["stages"]
        for stage, entry in stages.items():
            for name, ref in entry["outputs"].items():
                # read_json/read_batch verify size and sha256 (IntegrityError otherwise)
                if ref["key"].endswith(".json"):
                    storage.read_json(ObjectRef.from_dict(ref))
                else:
                    storage.read_batch(ObjectRef.from_dict(ref))
                assert ref["key"].startswith(manifest_path.parent.name), (stage, name)
    for step_dir in (base / "checkpoints").glob("step_*"):
        assert (step_dir / "COMMITTED").is_file(), f"{step_dir} is not committed"


def flow_subprocess(
    root: Path, run_id: str, overrides: list[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """``python -m flows.grpo`` in a child process (which a fault may SIGKILL), on this
    test session's Prefect API so that it does not start a server of its own.

    The child leads its own process group, killed with it as a lost worker's container
    would be: its forked reward workers must not outlive it. Output goes to files, not
    pipes, which an orphaned grandchild would hold open."""
    child_env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value(), **(env or {})}
    command = [
        sys.executable,
        "-m",
        "flows.grpo",
        "--config",
        str(CONFIG),
        "--storage-root",
        str(root),
        "--run-id",
        run_id,
        *overrides,
    ]
    log = root / f"flow-{run_id}-{time.monotonic_ns()}.log"
    root.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        child = subprocess.Popen(
            command,
            cwd=REPO,
            env=child_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = child.wait(timeout=900)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
    output = log.read_text()
    log.unlink()
    return subprocess.CompletedProcess(command, returncode, output, output)
