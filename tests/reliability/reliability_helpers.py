"""Shared pieces of the reliability suite: its config (``grpo_math_tiny_fast.yaml``: HF
generation, two prompts of two samples, two iterations), the final weights of a run on any
storage, and the checks that storage holds no half-written object."""

import tempfile
from pathlib import Path

from safetensors.torch import load_file

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.storage.run_storage import RunStorage

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "examples" / "configs" / "grpo_math_tiny_fast.yaml"
ITERATIONS = load_master_config(str(CONFIG)).grpo.max_num_steps


def run_dir(root: Path, run_id: str) -> Path:
    return root / "runs" / run_id


def final_weights(storage: RunStorage, step: int = ITERATIONS) -> dict:
    """The policy tensors of a committed checkpoint, on local disk or S3."""
    with tempfile.TemporaryDirectory() as tmp:
        return load_file(storage.fetch_checkpoint(step, tmp) / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), f"tensor {name} differs"


def assert_no_half_written_objects(storage: RunStorage) -> None:
    """No temporary object anywhere under the run; every manifest output exists whole,
    with the size and sha256 its entry records, and every other object of an iteration is
    its manifest (no output of an uncommitted stage); every checkpoint is COMMITTED."""
    base = storage.objects.run_path + "/"
    keys = [path.removeprefix(base) for path in storage.fs.find(storage.objects.run_path)]
    leftovers = [key for key in keys if ".tmp-" in key]
    assert leftovers == [], f"temporary objects left behind: {leftovers}"
    referenced = set()
    for manifest_key in [k for k in keys if k.startswith("iter_") and k.endswith("MANIFEST.json")]:
        iteration = int(manifest_key.split("/")[0].removeprefix("iter_"))
        for stage, entry in storage.read_manifest(iteration).stages.items():
            for name, ref in entry.outputs.items():
                # read_json/read_batch verify size and sha256 (IntegrityError otherwise)
                read = storage.read_json if ref.key.endswith(".json") else storage.read_batch
                read(ref)
                assert ref.key.startswith(manifest_key.split("/")[0]), (stage, name)
                referenced.add(ref.key)
    unreferenced = [
        key
        for key in keys
        if key.startswith("iter_") and not key.endswith("MANIFEST.json") and key not in referenced
    ]
    assert unreferenced == [], f"objects no manifest entry records: {unreferenced}"
    steps = {key.split("/")[1] for key in keys if key.startswith("checkpoints/")}
    uncommitted = [step for step in steps if f"checkpoints/{step}/COMMITTED" not in keys]
    assert uncommitted == [], f"checkpoints without COMMITTED: {uncommitted}"
