"""HFValue: scalar head on the tiny models, trained toward fixed returns, checkpointed."""

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForTokenClassification

from nemo_rl_core.algorithms.loss import MseValueLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.value import ValueConfig, make_value_model
from nemo_rl_core.models.value.hf_value import HFValue


def mse(clip: float | None = None) -> MseValueLossFn:
    return MseValueLossFn({"cliprange": clip})


def value_config(model_dir: Path, **overrides: Any) -> ValueConfig:
    base: dict[str, Any] = {
        "model_name": str(model_dir),
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "max_total_sequence_length": 32,
        "precision": "float32",
        "optimizer": {"name": "torch.optim.AdamW", "kwargs": {"lr": 3e-3, "weight_decay": 0.0}},
    }
    return ValueConfig.model_validate({**base, **overrides})


def rollout(seed: int = 0, batch: int = 4, seq: int = 20) -> BatchedDataDict:
    """Sequences with a response in their second half and per-sample returns of +-1."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
    positions = torch.arange(seq).unsqueeze(0)
    valid = positions < lengths.unsqueeze(1)
    ids = torch.randint(4, 500, (batch, seq), generator=gen) * valid
    token_mask = (valid & (positions >= seq // 3)).float()
    targets = torch.tensor([1.0, -1.0] * (batch // 2)).unsqueeze(1)
    return BatchedDataDict(
        input_ids=ids,
        input_lengths=lengths,
        token_mask=token_mask,
        sample_mask=torch.ones(batch),
        returns=targets * token_mask,
    )


def test_fresh_head_starts_at_zero(tiny_model_dir: Path) -> None:
    value = make_value_model(value_config(tiny_model_dir), init_optimizer=False)
    values = value.get_values(rollout())["values"]
    assert values.shape == (4, 20)
    assert torch.equal(values, torch.zeros_like(values))


@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "tiny_qwen2_dir"])
def test_value_model_trains_toward_targets(model_fixture: str, request) -> None:
    value = make_value_model(value_config(request.getfixturevalue(model_fixture)))
    data = rollout()
    losses = [value.train(data, mse())["loss"].item() for _ in range(12)]
    assert losses[-1] < 0.3 * losses[0], losses
    values = value.get_values(data)["values"]
    mask = data["token_mask"].bool()
    assert (values[0][mask[0]].mean() > 0.3) and (values[1][mask[1]].mean() < -0.3)


def test_clipped_value_loss_limits_each_step(tiny_model_dir: Path) -> None:
    value = make_value_model(value_config(tiny_model_dir, max_grad_norm=None))
    data = rollout()
    data["values"] = value.get_values(data)["values"]
    metrics = value.train(data, mse(clip=0.05))
    assert "vf_clipfrac" in metrics["all_mb_metrics"]
    moved = (value.get_values(data)["values"] - data["values"]).abs()
    assert moved.max() > 0


def test_values_only_see_the_prefix_before_each_token(tiny_model_dir: Path) -> None:
    value = make_value_model(value_config(tiny_model_dir))
    data = rollout()
    value.train(data, mse())  # a non-zero head
    before = value.get_values(data)["values"]
    changed = BatchedDataDict({**data, "input_ids": data["input_ids"].clone()})
    changed["input_ids"][:, 8] = 7
    after = value.get_values(changed)["values"]
    assert torch.equal(before[:, :9], after[:, :9])
    assert not torch.allclose(before[:, 9:], after[:, 9:])
    assert (before[:, 0] == 0).all()


@pytest.mark.parametrize(
    "section",
    [
        {
            "sequence_packing": {
                "enabled": True,
                "logprob_mb_tokens": 40,
                "sequence_length_round": 4,
            }
        },
        {
            "dynamic_batching": {
                "enabled": True,
                "logprob_mb_tokens": 40,
                "sequence_length_round": 8,
            }
        },
    ],
)
def test_packed_and_dynamic_values_equal_padded(
    tiny_model_dir: Path, tmp_path: Path, section: dict
) -> None:
    value = make_value_model(value_config(tiny_model_dir))
    data = rollout(batch=6)
    value.train(rollout(batch=4), mse())
    value.save_checkpoint(tmp_path / "v")
    other = make_value_model(
        value_config(tiny_model_dir, **section), weights_path=tmp_path / "v", init_optimizer=False
    )
    torch.testing.assert_close(
        other.get_values(data)["values"], value.get_values(data)["values"], atol=1e-5, rtol=0
    )


def test_checkpoint_round_trip_and_resume(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = value_config(tiny_model_dir)
    data = [rollout(seed=s) for s in range(3)]
    straight = HFValue(config)
    for d in data:
        straight.train(d, mse())
    first = HFValue(config)
    first.train(data[0], mse())
    first.save_checkpoint(tmp_path / "w", optimizer_path=tmp_path / "o")
    resumed = HFValue(config, weights_path=tmp_path / "w", optimizer_path=tmp_path / "o")
    for d in data[1:]:
        resumed.train(d, mse())
    for (name, a), b in zip(
        straight.model.named_parameters(), resumed.model.parameters(), strict=True
    ):
        assert torch.equal(a, b), name
    hf = AutoModelForTokenClassification.from_pretrained(tmp_path / "w")
    assert hf.config.num_labels == 1
    assert torch.equal(hf.score.weight, first.model.score.weight)
