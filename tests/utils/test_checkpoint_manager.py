"""NeMo RL's ``CheckpointManager`` for hand-written loops: its folder, its retention (the same
as the flows' storage keeps), resuming from either layout, and refusals of bad input."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from nemo_rl_core.config.checkpointing import CheckpointingConfig
from nemo_rl_core.storage.run_storage import RunStorage
from nemo_rl_core.utils.checkpoint import CheckpointManager
from nemo_rl_core.utils.checkpoint_manager import rank_checkpoints

# Steps and their training info: ties, a step without the metric, the newest without it.
HISTORY = {
    1: {"val:accuracy": 0.4},
    2: {"val:accuracy": 0.7},
    3: {"train:loss": 1.0},
    4: {"val:accuracy": 0.7},
    5: {"val:accuracy": 0.2},
    6: {},
}


def manager(root: Path, **settings: object) -> CheckpointManager:
    config = {"checkpoint_dir": root / "ckpts", "metric_name": "val:accuracy"}
    return CheckpointManager({**config, "higher_is_better": True, "keep_top_k": 2, **settings})


def save(checkpoints: CheckpointManager, step: int, info: dict) -> Path:
    folder = checkpoints.init_tmp_checkpoint(step, info)
    (folder / "policy").mkdir()
    checkpoints.finalize_checkpoint(folder)
    return checkpoints.checkpoint_dir / f"step_{step}"


def kept_steps(checkpoints: CheckpointManager) -> list[int]:
    return sorted(int(p.name.split("_")[1]) for p in checkpoints.checkpoint_dir.glob("step_*"))


def test_rank_orders_by_metric_then_newer_and_puts_missing_metrics_last() -> None:
    best_first = rank_checkpoints(HISTORY, "val:accuracy", True, HISTORY.__getitem__)
    assert best_first == [4, 2, 1, 5, 6, 3]
    lowest_first = rank_checkpoints(HISTORY, "val:accuracy", False, HISTORY.__getitem__)
    assert lowest_first == [5, 1, 4, 2, 6, 3]

    def never(step: int) -> dict:
        raise AssertionError("no metric: no training info is read")

    assert rank_checkpoints(HISTORY, None, True, never) == [6, 5, 4, 3, 2, 1]


def test_keeps_what_the_flows_storage_keeps_for_the_same_history(tmp_path: Path) -> None:
    """One ranking serves both: a loop's folder and a run's committed checkpoints keep the
    same steps (the top 2 and the newest)."""
    checkpoints = manager(tmp_path)
    storage = RunStorage(f"file://{tmp_path / 'store'}", "run-1")
    for step, info in HISTORY.items():
        save(checkpoints, step, info)
        source = tmp_path / f"src-{step}"
        source.mkdir()
        (source / "config.json").write_text("{}")
        storage.write_checkpoint(step, source, info)
        storage.prune_checkpoints(2, metric_name="val:accuracy", higher_is_better=True)
    assert kept_steps(checkpoints) == storage.committed_checkpoints() == [2, 4, 6]
    assert checkpoints.get_latest_checkpoint_path() == str(checkpoints.checkpoint_dir / "step_6")


def test_a_checkpoint_holds_its_info_and_config_and_a_resave_replaces_it(
    tmp_path: Path,
) -> None:
    checkpoints = manager(tmp_path, keep_top_k=None)
    folder = checkpoints.init_tmp_checkpoint(
        3, {"loss": torch.tensor(0.25), "step": np.int64(3)}, CheckpointingConfig()
    )
    assert folder.is_absolute() and folder.name == "tmp_step_3"
    assert yaml.safe_load((folder / "config.yaml").read_text())["save_period"] == 1
    (folder / "stale.txt").write_text("from the first save")
    checkpoints.finalize_checkpoint(folder)

    # A resumed run saves step 3 again: the new one replaces the old whole.
    save(checkpoints, 3, {"loss": 0.5})
    final = checkpoints.checkpoint_dir / "step_3"
    assert checkpoints.load_training_info(final) == {"loss": 0.5}
    assert not (final / "stale.txt").exists()
    assert [p.name for p in checkpoints.checkpoint_dir.iterdir()] == ["step_3"]


def test_a_save_cut_short_is_never_latest_or_best(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path)
    save(checkpoints, 1, {"val:accuracy": 0.1})
    checkpoints.init_tmp_checkpoint(2, {"val:accuracy": 0.9})  # never finalized
    (checkpoints.checkpoint_dir / "step_1-hf").mkdir()  # a converted copy beside it
    assert checkpoints.get_latest_checkpoint_path() == str(checkpoints.checkpoint_dir / "step_1")
    assert checkpoints.get_best_checkpoint_path() == str(checkpoints.checkpoint_dir / "step_1")


def test_best_leaves_out_checkpoints_without_the_metric_and_says_so(tmp_path: Path) -> None:
    checkpoints = manager(tmp_path, keep_top_k=None)
    for step, info in HISTORY.items():
        save(checkpoints, step, info)
    with pytest.warns(UserWarning, match=r"Ignoring 2 checkpoint\(s\) at step\(s\) \[3, 6\]"):
        assert checkpoints.get_best_checkpoint_path().endswith("step_4")  # type: ignore[union-attr]

    unranked = manager(tmp_path / "other", metric_name="val:reward")
    save(unranked, 1, {})
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        assert unranked.get_best_checkpoint_path().endswith("step_1")  # type: ignore[union-attr]
    assert "Returning latest checkpoint" in str(said[-1].message)


@pytest.mark.parametrize("component", ["policy", "value"])
def test_resume_paths_of_nemo_rl_layouts(tmp_path: Path, component: str) -> None:
    separate = tmp_path / "dtensor" / component
    (separate / "weights").mkdir(parents=True)
    (separate / "optimizer").mkdir()
    got = CheckpointManager.get_resume_paths(tmp_path / "dtensor", model_component=component)  # type: ignore[arg-type]
    assert got == (separate / "weights", separate / "optimizer")

    embedded = tmp_path / "megatron" / component / "weights" / "iter_0000000"
    embedded.mkdir(parents=True)
    torch.save({"optimizer": {"state": {}}}, embedded / "common.pt")
    weights, optimizer = CheckpointManager.get_resume_paths(
        tmp_path / "megatron",
        model_component=component,  # type: ignore[arg-type]
    )
    assert weights == embedded.parent and optimizer == embedded.parent.parent / "optimizer"
    assert optimizer is not None and not optimizer.exists()  # a flag: the state is in weights

    (tmp_path / "bare" / component / "weights").mkdir(parents=True)
    with pytest.warns(UserWarning, match="Optimizer state not found"):
        got = CheckpointManager.get_resume_paths(tmp_path / "bare", model_component=component)  # type: ignore[arg-type]
    assert got == (tmp_path / "bare" / component / "weights", None)
    assert CheckpointManager.get_resume_paths(None) == (None, None)


def test_resume_paths_of_a_checkpoint_the_flows_committed(tmp_path: Path) -> None:
    """The policy at the root in HF layout, the value model in ``value/``, each with its
    ``optimizer/``: a ported loop resumes from a flow's checkpoint."""
    step = tmp_path / "step_000002"
    for model in (step, step / "value"):
        (model / "optimizer").mkdir(parents=True)
        (model / "config.json").write_text("{}")
    assert CheckpointManager.get_resume_paths(step) == (step, step / "optimizer")
    assert CheckpointManager.get_resume_paths(step, model_component="value") == (
        step / "value",
        step / "value" / "optimizer",
    )


def test_bad_input_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpointing.checkpoint_dir: missing"):
        CheckpointManager({"metric_name": None})
    with pytest.raises(ValueError, match=r"checkpointing.keep_top_k: -1"):
        manager(tmp_path, keep_top_k=-1)
    checkpoints = manager(tmp_path)
    with pytest.raises(ValueError, match=r"training_info\['logprobs'\]: shape \(2,\)"):
        checkpoints.init_tmp_checkpoint(1, {"logprobs": torch.zeros(2)})
    assert not checkpoints.checkpoint_dir.exists()  # refused before anything is written
    saved = save(checkpoints, 1, {"val:accuracy": 0.5})
    with pytest.raises(ValueError, match="not a checkpoint from init_tmp_checkpoint"):
        checkpoints.finalize_checkpoint(saved)
    assert checkpoints.load_training_info(saved) == {"val:accuracy": 0.5}  # left as it was
