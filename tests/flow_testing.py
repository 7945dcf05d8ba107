"""What the preference flows' end-to-end tests read of a stored run: a manifest's stages and
where a checkpoint is."""

import json
from pathlib import Path


def stages_of(root: Path, run_id: str, iteration: int) -> dict:
    """The manifest entries of one iteration's stages, by stage name."""
    path = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


def checkpoint_dir(root: Path, run_id: str, step: int) -> Path:
    return root / "runs" / run_id / "checkpoints" / f"step_{step:06d}"
