"""A continued run whose stored iterations vanished is refused, not restarted at iteration 0
without a word: what its records expected and what was found are named, with how to start
over deliberately. What survives decides (``flows/lost_progress.py``):

- checkpoints gone, manifests there: refused (the weights to continue from are gone);
- manifests gone, checkpoints there: continued from the newest checkpoint, with a warning;
- only config.yaml left, or nothing at all: refused when an earlier flow run of the run on
  this root completed stages (Prefect's records survive the store), else started at 0;
- ``start_over``: what is stored is deleted and the run trains from iteration 0."""

import shutil
from pathlib import Path

import pytest
from reliability_helpers import CONFIG, ITERATIONS, run_dir

from flows.grpo import grpo
from flows.lost_progress import LostProgressError


@pytest.fixture(scope="module")
def finished(prefect_api, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of ``ITERATIONS`` iterations, all committed (one test mutates it: the others
    take copies of ``pristine``)."""
    root = tmp_path_factory.mktemp("lost")
    grpo(config_path=str(CONFIG), run_id="lost", storage_root=str(root))
    return root


@pytest.fixture(scope="module")
def pristine(finished: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("pristine") / "root"
    shutil.copytree(finished, copy)
    return copy


def copy_of(root: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    shutil.copytree(root, copy)
    return copy


def continued(root: Path, **parameters) -> dict:
    return grpo(config_path=str(CONFIG), run_id="lost", storage_root=str(root), **parameters)


def test_checkpoints_gone_but_manifests_there_is_refused_and_start_over_deletes_the_rest(
    pristine: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = copy_of(pristine, tmp_path)
    shutil.rmtree(run_dir(root, "lost") / "checkpoints")
    with pytest.raises(LostProgressError) as refused:
        continued(root, max_num_steps=ITERATIONS + 1)
    message = str(refused.value)
    last = ITERATIONS - 1
    assert message.startswith(
        f"run lost: its manifests record checkpoint step {ITERATIONS} committed "
        f"({root}/runs/lost/iter_{last:06d}/MANIFEST.json: its committing stage is complete), "
        f"but no committed checkpoint is there ({root}/runs/lost/checkpoints)"
    )
    assert "use a new run id, or pass --start-over" in message
    assert not (run_dir(root, "lost") / "checkpoints").exists(), "the refused run wrote"

    summary = continued(root, steps_per_run=1, start_over=True)
    assert summary["iterations"] == [0]
    assert f"run lost: starting over (start_over): deleted {ITERATIONS} stored" in caplog.text
    assert sorted(p.name for p in run_dir(root, "lost").glob("iter_*")) == ["iter_000000"]


def test_manifests_gone_but_checkpoints_there_continues_and_says_what_is_gone(
    pristine: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = copy_of(pristine, tmp_path)
    for iteration in range(ITERATIONS):
        shutil.rmtree(run_dir(root, "lost") / f"iter_{iteration:06d}")
    summary = continued(root, max_num_steps=ITERATIONS + 1)
    assert summary["iterations"] == [ITERATIONS]
    assert (
        f"run lost: iteration(s) 0-{ITERATIONS - 1} have no stored records (manifest, "
        f"batches, rollouts: their metrics are gone); continuing from committed checkpoint "
        f"step {ITERATIONS}"
    ) in caplog.text


def test_only_config_left_or_store_wiped_is_refused_naming_the_earlier_flow_run(
    finished: Path, pristine: Path
) -> None:
    """On the run's own root (copied first, as ``pristine``, for the other tests): Prefect
    remembers the flow run that trained the run there."""
    run = run_dir(finished, "lost")
    for child in run.iterdir():
        if child.name != "config.yaml":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    with pytest.raises(LostProgressError) as refused:
        continued(finished)
    message = str(refused.value)
    assert message.startswith(
        f"run lost: {finished}/runs/lost holds only config.yaml (no iteration, no "
        "checkpoint), but Prefect records flow run grpo-lost ("
    )
    assert f"driving this run on {finished} and completing" in message
    assert "its stored progress is gone" in message

    shutil.rmtree(run)  # the store wiped
    with pytest.raises(LostProgressError, match=r"runs/lost holds nothing \(no iteration"):
        continued(finished)

    started_over = continued(finished, steps_per_run=1, start_over=True)
    assert started_over["iterations"] == [0]


def test_only_config_left_and_no_earlier_flow_run_starts_at_zero_saying_so(
    pristine: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A run killed while its models loaded leaves only its config: nothing to lose."""
    root = tmp_path / "killed-early"
    (root / "runs" / "lost").mkdir(parents=True)
    shutil.copy(run_dir(pristine, "lost") / "config.yaml", root / "runs" / "lost")
    summary = continued(root, steps_per_run=1)
    assert summary["iterations"] == [0]
    assert (
        f"run lost: {root}/runs/lost holds config.yaml but no iteration and no checkpoint, "
        "and no earlier flow run of it completed a stage: starting at iteration 0"
    ) in caplog.text
