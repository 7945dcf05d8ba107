"""End to end: the on-policy distillation flow on the embedded default (tiny-llama-arith
teaches its random, smaller student on built-in additions; no server, local storage). A
resume and a rerun to the same weights: tests/orchestration (the rules) and
test_grpo_flow.py (bit-identical on a real model)."""

import json
from pathlib import Path

import pytest
import torch

from flows.distillation import distillation
from nemo_rl_core.algorithms.distillation import build_loss_fn
from nemo_rl_core.algorithms.distillation_config import DistillationMasterConfig
from nemo_rl_core.algorithms.grpo_config import load_master_config
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.local_models import build_tiny_model, resolve_model
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.pipeline.algorithms import DISTILLATION
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.utils.config import ConfigError

pytestmark = pytest.mark.e2e
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "distillation_tiny.yaml"
STEPS = 3
OVERRIDES = [
    f"distillation.max_num_steps={STEPS}",
    "distillation.val_period=0",
    "distillation.val_at_start=false",
]


def manifest(root: Path, run_id: str, iteration: int) -> dict:
    return json.loads(
        (root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json").read_text()
    )


def checkpoint(root: Path, run_id: str, step: int = STEPS) -> Path:
    return root / "runs" / run_id / "checkpoints" / f"step_{step:06d}"


def run(root: Path, run_id: str, *extra: str) -> dict:
    return distillation(
        config_path=str(CONFIG),
        overrides=[*OVERRIDES, *extra],
        run_id=run_id,
        storage_root=str(root),
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("distillation")
    return root, run(root, "clean")


def kl_to_teacher(root: Path, run_id: str, weights: Path | None) -> float:
    """The loss (the mixed KL to the teacher) of the student at ``weights`` (None: its
    starting weights) on iteration 0's stored teacher batch, without an update."""
    config = load_master_config(str(CONFIG), OVERRIDES, DistillationMasterConfig)
    assert isinstance(config, DistillationMasterConfig)
    local = str(resolve_model(config.policy.model_name))
    policy = make_policy(
        config.policy.model_copy(update={"model_name": local}),
        weights_path=weights,
        init_reference_model=False,
    )
    entry = manifest(root, run_id, 0)["stages"]["teacher"]["outputs"]
    batch = open_storage(RunRef(str(root), run_id)).read_batch(
        StageRef.from_dict(entry).outputs["batch"]
    )
    try:
        results = policy.train(batch, build_loss_fn(config), eval_mode=True)
    finally:
        policy.shutdown()
    return float(results["loss"].sum())


def test_student_moves_toward_the_teacher(uninterrupted):
    root, summary = uninterrupted
    assert summary["iterations"] == list(range(STEPS))
    assert set(manifest(root, "clean", 0)["stages"]) == set(DISTILLATION.stage_names) - {"validate"}
    before = kl_to_teacher(root, "clean", None)
    after = kl_to_teacher(root, "clean", checkpoint(root, "clean"))
    assert after < 0.9 * before, (before, after)


def teacher_batch(root: Path, run_id: str, iteration: int) -> BatchedDataDict:
    entry = manifest(root, run_id, iteration)["stages"]["teacher"]["outputs"]
    storage = open_storage(RunRef(str(root), run_id))
    return storage.read_batch(StageRef.from_dict(entry).outputs["batch"])


def test_teacher_logits_are_stored_for_every_position(uninterrupted):
    root, _ = uninterrupted
    batch = teacher_batch(root, "clean", 1)
    samples, length = batch["input_ids"].shape
    assert batch["teacher_topk_logits"].shape == (samples, length, 16)
    assert batch["teacher_topk_indices"].shape == (samples, length, 16)
    # the last position predicts nothing: padding; every earlier one holds the teacher's top-k,
    # best first
    assert batch["teacher_topk_logits"][:, -1].eq(0).all()
    logits = batch["teacher_topk_logits"][:, :-1]
    assert (logits[..., :-1] >= logits[..., 1:]).all()


def test_a_teacher_that_cannot_teach_is_refused_before_any_work(tmp_path):
    other = build_tiny_model(tmp_path / "other-vocab", vocab_size=300)
    with pytest.raises(ConfigError, match=r"teacher.model_name: '.*other-vocab' has a vocab"):
        run(tmp_path / "runs-a", "bad-teacher", f"teacher.model_name={other}")
    with pytest.raises(ConfigError, match=r"distillation.topk_logits_k=4096: larger than"):
        run(tmp_path / "runs-b", "bad-k", "distillation.topk_logits_k=4096")
    # refused under the run's lease, taken first and given back: no file is left behind
    # (a local store keeps the empty folders the lease file was in)
    for root in ("runs-a", "runs-b"):
        assert [p for p in (tmp_path / root).rglob("*") if p.is_file()] == []


@pytest.mark.distributed
def test_teacher_and_student_on_two_local_ranks(uninterrupted, tmp_path):
    """``cluster.gpus_per_node: 2`` on CPU: the teacher's stage runs on the two training
    ranks too, the teacher sharded by its own ``dtensor_cfg.tensor_parallel_size: 2`` (the
    student data parallel over both); its top-k logits equal the one-process run's within
    1e-4 (logits up to ~15), the student's step (loss, grad norm) within 1e-5, and one warm
    rank group holds both models for both iterations, as NeMo RL colocates them."""
    root, _ = uninterrupted
    tp2 = "teacher.dtensor_cfg.tensor_parallel_size=2"
    run(tmp_path, "ranks", "cluster.gpus_per_node=2", tp2, "distillation.max_num_steps=2")
    got, expected = (teacher_batch(r, i, 0) for r, i in [(tmp_path, "ranks"), (root, "clean")])
    assert torch.equal(got["input_ids"], expected["input_ids"])
    assert torch.equal(got["teacher_topk_indices"], expected["teacher_topk_indices"])
    # TP sums each logit's two halves in another order: logits up to ~15 agree within 3e-5
    torch.testing.assert_close(
        got["teacher_topk_logits"], expected["teacher_topk_logits"], atol=1e-4, rtol=0
    )
    train, expected_train = (
        manifest(r, i, 0)["stages"]["train"]["metrics"]
        for r, i in [(tmp_path, "ranks"), (root, "clean")]
    )
    assert train["loss"] == pytest.approx(expected_train["loss"], abs=1e-5)
    assert train["grad_norm"] == pytest.approx(expected_train["grad_norm"], abs=1e-5)
    ran_on = [
        manifest(tmp_path, "ranks", it)["stages"][stage]["ran_on"]
        for it in (0, 1)
        for stage in ("teacher", "train")
    ]
    assert [r["ranks"] for r in ran_on] == [2, 2, 2, 2]
    assert len({r["pid"] for r in ran_on}) == 1, "one warm rank group holds both models"
