"""What the end-to-end tests (preference flows, SPMD training) read of a stored run: a
manifest's stages and a checkpoint's weights, compared bit for bit."""

import json
from pathlib import Path

from safetensors.torch import load_file


def stages_of(root: Path, run_id: str, iteration: int) -> dict:
    """The manifest entries of one iteration's stages, by stage name."""
    path = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


def checkpoint_dir(root: Path, run_id: str, step: int) -> Path:
    return root / "runs" / run_id / "checkpoints" / f"step_{step:06d}"


def assert_bit_identical(a: Path, b: Path) -> None:
    """Two checkpoints hold the same weights, bit for bit."""
    first, second = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert sorted(first) == sorted(second)
    assert all(first[name].equal(second[name]) for name in first), "weights differ"
