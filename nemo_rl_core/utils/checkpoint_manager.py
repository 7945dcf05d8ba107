"""NeMo RL's ``CheckpointManager``: the checkpoint folder a hand-written training loop keeps
on a local disk (``checkpoint_dir/step_<n>/``, each with ``training_info.json`` and
``config.yaml``), so that a NeMo RL script ported here keeps its checkpoint code.

The flows do not use it: they commit checkpoints to the run's storage (local or ``s3://``,
:mod:`nemo_rl_core.storage.checkpoint_store`). Both keep the top ``keep_top_k`` by
:func:`rank_checkpoints`, NeMo RL's order, so a run's retention is the same either way.

A checkpoint is written under ``tmp_step_<n>`` and renamed to ``step_<n>`` when complete: a
save cut short leaves a ``tmp_`` folder, which no method here reads.
"""

import json
import os
import re
import shutil
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from nemo_rl_core.utils.checkpoint import MODEL_DIRS, OPTIMIZER_DIR

STEP_DIR = re.compile(r"step_(\d+)")
TMP_PREFIX = "tmp_"
OLD_PREFIX = "old_"
INFO_FILE = "training_info.json"
CONFIG_FILE = "config.yaml"
# Where Megatron keeps its optimizer inside the weights (NeMo RL's MCore checkpoints).
MEGATRON_COMMON = Path("iter_0000000") / "common.pt"


def rank_checkpoints(
    steps: Iterable[int],
    metric_name: str | None,
    higher_is_better: bool,
    info_of: Callable[[int], Mapping[str, Any]],
) -> list[int]:
    """The steps, best first, in NeMo RL's order: by ``metric_name`` from each step's training
    info (a step without it counts as the worst), the newer first among equals; with no
    metric, the newest first (``info_of`` is then never called)."""
    if metric_name is None:
        return sorted(steps, reverse=True)
    worst = -float("inf") if higher_is_better else float("inf")
    sign = 1 if higher_is_better else -1
    infos = {step: info_of(step) for step in steps}
    return sorted(
        infos, key=lambda step: (sign * infos[step].get(metric_name, worst), step), reverse=True
    )


class CheckpointManager:
    """A NeMo RL training loop's checkpoints: ``init_tmp_checkpoint`` opens one (the loop
    saves its models into it), ``finalize_checkpoint`` completes it and drops those outside
    the top ``keep_top_k``. ``config`` is NeMo RL's ``checkpointing:`` section, as a mapping
    or :class:`~nemo_rl_core.config.checkpointing.CheckpointingConfig`."""

    def __init__(self, config: Mapping[str, Any] | BaseModel):
        settings = dict(config.model_dump() if isinstance(config, BaseModel) else config)
        if settings.get("checkpoint_dir") is None:
            raise ValueError("checkpointing.checkpoint_dir: missing (the folder to keep them in)")
        keep_top_k = settings.get("keep_top_k")
        if keep_top_k is not None and (not isinstance(keep_top_k, int) or keep_top_k < 0):
            raise ValueError(f"checkpointing.keep_top_k: {keep_top_k!r} is not a count (or null)")
        self.checkpoint_dir = Path(settings["checkpoint_dir"])
        self.metric_name: str | None = settings.get("metric_name")
        self.higher_is_better: bool = settings.get("higher_is_better", True)
        self.keep_top_k: int | None = keep_top_k
        # Read by the loop, which decides what it saves (NeMo RL's defaults).
        self.save_optimizer: bool = settings.get("save_optimizer", True)
        self.model_save_format: str | None = settings.get("model_save_format", "safetensors")
        self.save_consolidated: bool = settings.get("save_consolidated", False)

    @staticmethod
    def get_resume_paths(
        last_checkpoint_path: str | os.PathLike[str] | None,
        *,
        model_component: Literal["policy", "value"] = "policy",
    ) -> tuple[Path | None, Path | None]:
        """The weights and optimizer paths to resume ``model_component`` from (both ``None``
        without a checkpoint; the optimizer's ``None`` when none was saved, with a warning).

        NeMo RL's layout is ``<component>/weights`` and ``<component>/optimizer``; a Megatron
        checkpoint embeds its optimizer in the weights, and the optimizer path then only says
        so. A checkpoint the flows committed (the model in HF layout, its ``optimizer/``
        inside) resolves to its own folders."""
        if not last_checkpoint_path:
            return None, None
        checkpoint = Path(last_checkpoint_path)
        component = checkpoint / model_component
        weights, optimizer = component / "weights", component / "optimizer"
        if (
            not weights.exists()
            and (checkpoint / MODEL_DIRS[model_component] / "config.json").exists()
        ):
            weights = checkpoint / MODEL_DIRS[model_component]
            optimizer = weights / OPTIMIZER_DIR
        if optimizer.exists() or _embeds_optimizer(weights / MEGATRON_COMMON):
            return weights, optimizer
        warnings.warn(
            f"Optimizer state not found at {optimizer}, nor embedded in Megatron weights under "
            f"{weights}: the optimizer starts fresh.",
            stacklevel=2,
        )
        return weights, None

    def init_tmp_checkpoint(
        self,
        step: int,
        training_info: Mapping[str, Any],
        run_config: BaseModel | Mapping[str, Any] | None = None,
    ) -> Path:
        """Open checkpoint ``step`` as ``tmp_step_<step>`` with its training info (tensor and
        array scalars as numbers) and the run's config; returns its absolute path."""
        info = {key: _plain(key, value) for key, value in training_info.items()}
        folder = (self.checkpoint_dir / f"{TMP_PREFIX}step_{step}").absolute()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / INFO_FILE).write_text(json.dumps(info))
        if run_config is not None:
            dumped = run_config.model_dump() if hasattr(run_config, "model_dump") else run_config
            (folder / CONFIG_FILE).write_text(yaml.safe_dump(dict(dumped)))
        return folder

    def finalize_checkpoint(self, checkpoint_path: str | os.PathLike[str]) -> None:
        """Rename ``tmp_step_<n>`` to ``step_<n>`` (an existing ``step_<n>``, from a resumed
        run, is replaced: moved aside first, deleted last), then drop those outside the top
        ``keep_top_k``."""
        tmp = Path(checkpoint_path)
        if not tmp.name.startswith(TMP_PREFIX) or not STEP_DIR.fullmatch(
            final := tmp.name.removeprefix(TMP_PREFIX)
        ):
            raise ValueError(f"{tmp}: not a checkpoint from init_tmp_checkpoint (tmp_step_<n>)")
        target = tmp.parent / final
        if target.exists():
            old = tmp.parent / f"{OLD_PREFIX}{final}"
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            tmp.rename(target)
            shutil.rmtree(old)
        else:
            tmp.rename(target)
        self.remove_old_checkpoints()

    def remove_old_checkpoints(self, exclude_latest: bool = True) -> None:
        """Delete the checkpoints outside the top ``keep_top_k`` (by :func:`rank_checkpoints`);
        the latest stays anyway when ``exclude_latest`` (then k+1 may stay)."""
        if self.keep_top_k is None:
            return
        infos = self._checkpoint_infos()
        ranked = rank_checkpoints(infos, self.metric_name, self.higher_is_better, infos.__getitem__)
        latest = max(infos, default=None)
        for step in ranked[self.keep_top_k :]:
            if not (exclude_latest and step == latest):
                print(f"Removing checkpoint step_{step}: outside the top {self.keep_top_k}")
                shutil.rmtree(self.checkpoint_dir / f"step_{step}")

    def get_best_checkpoint_path(self) -> str | None:
        """The checkpoint with the best ``metric_name``; those without the metric are left
        out with a warning, and the latest is returned when none has it."""
        infos = self._checkpoint_infos()
        if not infos:
            return None
        scored = {step: info for step, info in infos.items() if self.metric_name in info}
        if missing := sorted(set(infos) - set(scored)):
            warnings.warn(
                f"Ignoring {len(missing)} checkpoint(s) at step(s) {missing} without metric "
                f"'{self.metric_name}': validate at those steps (val_period, val_at_end) to "
                "rank them.",
                stacklevel=2,
            )
        if not scored:
            warnings.warn(
                f"No checkpoints contain metric '{self.metric_name}'. Returning latest "
                "checkpoint; set val_at_end or a val_period that divides max_steps to rank them.",
                stacklevel=2,
            )
            return self.get_latest_checkpoint_path()
        best = rank_checkpoints(scored, self.metric_name, self.higher_is_better, scored.__getitem__)
        return str(self.checkpoint_dir / f"step_{best[0]}")

    def get_latest_checkpoint_path(self) -> str | None:
        """The ``step_<n>`` folder with the highest ``n`` (by number, not by name)."""
        steps = self._steps()
        return str(self.checkpoint_dir / f"step_{max(steps)}") if steps else None

    def load_training_info(
        self, checkpoint_path: str | os.PathLike[str] | None = None
    ) -> dict[str, Any] | None:
        """A checkpoint's ``training_info.json``; ``None`` for no checkpoint."""
        if checkpoint_path is None:
            return None
        info: dict[str, Any] = json.loads((Path(checkpoint_path) / INFO_FILE).read_text())
        return info

    def _steps(self) -> list[int]:
        if not self.checkpoint_dir.is_dir():
            return []
        return [
            int(match.group(1))
            for entry in self.checkpoint_dir.iterdir()
            if entry.is_dir() and (match := STEP_DIR.fullmatch(entry.name))
        ]

    def _checkpoint_infos(self) -> dict[int, dict[str, Any]]:
        """Each complete checkpoint's training info (a ``step_`` folder without one is not a
        checkpoint of this manager's)."""
        infos = {}
        for step in self._steps():
            info_file = self.checkpoint_dir / f"step_{step}" / INFO_FILE
            if info_file.exists():
                infos[step] = json.loads(info_file.read_text())
        return infos


def _plain(key: str, value: Any) -> Any:
    """A tensor's or array's value as a JSON number (NeMo RL's loops pass 0-d ones)."""
    if hasattr(value, "item") and hasattr(value, "shape"):
        if tuple(value.shape) not in ((), (1,)):
            raise ValueError(f"training_info[{key!r}]: shape {tuple(value.shape)}, not one number")
        return value.item()
    return value


def _embeds_optimizer(common_pt: Path) -> bool:
    """Whether a Megatron checkpoint's ``common.pt`` holds the optimizer state. It is the
    checkpoint's own pickle (Megatron writes more than tensors), read as NeMo RL reads it."""
    if not common_pt.exists():
        return False
    import torch  # only for Megatron checkpoints: the rest of this module needs no torch

    return "optimizer" in torch.load(common_pt, map_location="cpu", weights_only=False)
