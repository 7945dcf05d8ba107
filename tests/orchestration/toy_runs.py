"""Runs of the toy pipeline's flow on one storage root, and what the tests read of them:
manifests and the bytes of committed weights."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toy_pipeline import TOY

from flows.loop import training_flow
from nemo_rl_core.utils.checkpoint import WEIGHTS_FILE

CONFIG = Path(__file__).with_name("toy.yaml")
toy_flow = training_flow(TOY)


@dataclass(frozen=True)
class ToyRuns:
    """Runs under ``root``, each starting from the initial model at ``model``."""

    root: Path
    model: Path

    def run(self, run_id: str | None, *overrides: str, **params: Any) -> Any:
        """The toy flow's summary (its final state with ``return_state=True``); a run id of
        None starts a new run."""
        return toy_flow(
            config_path=str(CONFIG),
            overrides=self.overrides(*overrides),
            run_id=run_id,
            storage_root=str(self.root),
            **params,
        )

    def overrides(self, *extra: str) -> list[str]:
        """``extra`` after the model and log folder of these runs."""
        return [f"policy.model_name={self.model}", f"++logger.log_dir={self.root / 'logs'}", *extra]

    def run_dir(self, run_id: str) -> Path:
        return self.root / "runs" / run_id

    def stages(self, run_id: str, iteration: int) -> dict[str, Any]:
        """The manifest entries of one iteration's stages, by recorded name."""
        manifest = self.run_dir(run_id) / f"iter_{iteration:06d}" / "MANIFEST.json"
        return json.loads(manifest.read_text())["stages"]

    def weights(self, run_id: str, step: int) -> bytes:
        """Checkpoint ``step``'s weights file, byte for byte."""
        checkpoint = self.run_dir(run_id) / "checkpoints" / f"step_{step:06d}"
        return (checkpoint / WEIGHTS_FILE).read_bytes()

    def finished_at(self, run_id: str, iteration: int) -> dict[str, str]:
        return {name: e["finished_at"] for name, e in self.stages(run_id, iteration).items()}
