"""HFPolicy against plain transformers math and NeMo RL's training contract, on tiny models."""

from pathlib import Path
from typing import Any

import pytest
import torch
from nemo_rl_examples import SMALL, validated
from policy_testing import manual_logprobs, policy_config, token_batch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_rl_core.algorithms.loss import ClippedPGLossFn, LossInputType, LossType, NLLLossFn
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.local_models import ModelNotFoundError, build_tiny_model
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.policy.hf_loading import VocabMismatchError, load_tokenizer
from nemo_rl_core.models.policy.hf_policy import HFPolicy
from nemo_rl_core.models.policy.hf_trainer import NonFiniteTrainingError
from nemo_rl_core.utils.config import ConfigError


def token_budget(section: str, tokens: int, **extra: Any) -> dict[str, Any]:
    """Dynamic batching or packing with a small budget so batches split into several parts."""
    budget = {"enabled": True, "train_mb_tokens": tokens, "logprob_mb_tokens": tokens}
    return {section: {**budget, **extra}}


LAYOUTS = {
    "padded": {},
    "dynamic": token_budget("dynamic_batching", 48, sequence_length_round=8),
    "packed": token_budget("sequence_packing", 48, sequence_length_round=4),
}
# Three ways to cut the same global batch of 4 into microbatches, per layout.
SPLITS = {
    "padded": [{"train_micro_batch_size": n} for n in (1, 2, 4)],
    "dynamic": [token_budget("dynamic_batching", n, sequence_length_round=8) for n in (24, 48, 96)],
    "packed": [token_budget("sequence_packing", n, sequence_length_round=4) for n in (24, 48, 96)],
}


def params_of(policy: HFPolicy) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in policy.model.named_parameters()}


def max_param_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("model_fixture", ["tiny_model_dir", "tiny_qwen2_dir"])
def test_get_logprobs_matches_manual_forward(
    layout: str, model_fixture: str, request: pytest.FixtureRequest
) -> None:
    model_dir = request.getfixturevalue(model_fixture)
    data = token_batch(batch=5)
    policy = make_policy(policy_config(model_dir, **LAYOUTS[layout]), init_optimizer=False)
    logprobs = policy.get_logprobs(data)["logprobs"]
    expected = manual_logprobs(model_dir, data)
    assert logprobs.shape == data["input_ids"].shape
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
    assert (logprobs[:, 0] == 0).all()


def test_nemo_rl_dynamic_batching_caps_the_rounded_length_at_the_batch_width(
    nemo_rl_configs: Path, tiny_model_dir: Path
) -> None:
    """NeMo RL's grpo_math_1B.yaml with dynamic batching on and one sample per microbatch:
    its budget is max_total_sequence_length x 1 = 160 tokens and its sequence_length_round
    64, so a 150-token sample rounds up to 192; NeMo RL caps that at the batch's width
    (160) and runs, and so does the policy here, with the same logprobs as a plain forward."""
    overrides = [
        *SMALL,
        "policy.train_global_batch_size=2",
        "policy.train_micro_batch_size=1",
        "policy.logprob_batch_size=1",
        "policy.sequence_packing.enabled=false",
        "policy.dynamic_batching.enabled=true",
        "data.train.dataset_name=arithmetic",
    ]
    config = validated(nemo_rl_configs / "grpo_math_1B.yaml", overrides).policy
    assert (config.dynamic_batching.train_mb_tokens, config.dynamic_batching.logprob_mb_tokens) == (
        160,
        160,
    )
    assert config.dynamic_batching.sequence_length_round == 64
    data = token_batch(batch=2, seq=160)
    data["input_lengths"][1] = 150
    data["input_ids"][1, 150:] = 0
    data["token_mask"][1, 150:] = 0
    policy = make_policy(config.model_copy(update={"model_name": str(tiny_model_dir)}))
    logprobs = policy.get_logprobs(data)["logprobs"]
    torch.testing.assert_close(logprobs, manual_logprobs(tiny_model_dir, data), atol=1e-5, rtol=0)
    metrics = policy.train(data, NLLLossFn())
    assert torch.isfinite(torch.as_tensor(metrics["loss"])).all()


def test_reference_logprobs_stay_at_the_base_model(tiny_model_dir: Path, batch) -> None:
    policy = make_policy(policy_config(tiny_model_dir))
    before = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
    policy.train(batch, NLLLossFn())
    after_ref = policy.get_reference_policy_logprobs(batch)["reference_logprobs"]
    after_policy = policy.get_logprobs(batch)["logprobs"]
    assert torch.equal(before, after_ref)
    assert not torch.allclose(after_policy, after_ref)
    without = make_policy(policy_config(tiny_model_dir), init_reference_model=False)
    with pytest.raises(RuntimeError, match="init_reference_model"):
        without.get_reference_policy_logprobs(batch)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_topk_logits_agree_with_torch_topk(tiny_model_dir: Path, batch, layout: str) -> None:
    policy = make_policy(policy_config(tiny_model_dir, **LAYOUTS[layout]), init_optimizer=False)
    out = policy.get_topk_logits(batch, k=7)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    valid = torch.arange(ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=valid.long()).logits[:, :-1]
    values, indices = logits.topk(7, dim=-1)
    assert out["topk_logits"].shape == (ids.shape[0], ids.shape[1] - 1, 7)
    mask = valid[:, :-1]
    torch.testing.assert_close(out["topk_logits"][mask], values[mask], atol=1e-5, rtol=0)
    assert torch.equal(out["topk_indices"][mask], indices[mask])


OPTIMIZERS = {
    # SGD exposes the accumulated gradient itself; AdamW at a typical RL learning rate.
    "sgd": {"name": "torch.optim.SGD", "kwargs": {"lr": 1.0}},
    "adamw": {"name": "torch.optim.AdamW", "kwargs": {"lr": 1e-4, "weight_decay": 0.01}},
}


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("layout", sorted(SPLITS))
def test_microbatch_split_gives_the_same_step(
    tiny_model_dir: Path, layout: str, optimizer: str
) -> None:
    data = token_batch(batch=4, seed=3)
    after = []
    for split in SPLITS[layout]:
        config = policy_config(tiny_model_dir, optimizer=OPTIMIZERS[optimizer], **split)
        policy = make_policy(config, init_reference_model=False)
        metrics = policy.train(data, NLLLossFn(), gbs=4)
        after.append((len(metrics["all_mb_metrics"]["loss"]), params_of(policy)))
    assert len({count for count, _ in after}) == 3, "each split should use another count"
    assert max_param_diff(after[0][1], after[1][1]) < 1e-5
    assert max_param_diff(after[0][1], after[2][1]) < 1e-5
    initial = params_of(make_policy(config, init_optimizer=False, init_reference_model=False))
    assert max_param_diff(after[0][1], initial) > 5e-5


def test_train_metrics_follow_nemo_rl(tiny_model_dir: Path) -> None:
    data = token_batch(batch=8, seed=5)
    policy = make_policy(policy_config(tiny_model_dir, max_grad_norm=0.5))
    metrics = policy.train(data, NLLLossFn(), gbs=4, mbs=2)
    assert metrics["loss"].shape == (2,) and metrics["grad_norm"].shape == (2,)
    assert len(metrics["all_mb_metrics"]["loss"]) == 4
    expected_toks = sum((data.get_batch(i, 4)["token_mask"][:, 1:]).sum().item() for i in range(2))
    assert metrics["global_valid_toks"] == expected_toks
    assert metrics["global_valid_seqs"] == 8
    assert metrics["lr"] == pytest.approx(1e-3)
    # Each global batch's loss is the sum of its microbatch shares.
    mb_losses = metrics["all_mb_metrics"]["loss"]
    assert metrics["loss"][0].item() == pytest.approx(mb_losses[0] + mb_losses[1], rel=1e-6)
    eval_metrics = policy.train(data, NLLLossFn(), eval_mode=True, gbs=4, mbs=2)
    assert eval_metrics["grad_norm"].numel() == 0


def layer_calls_in_one_step(policy: HFPolicy) -> tuple[int, dict[str, torch.Tensor]]:
    """How often the first decoder layer ran with grad in one training step, and the weights
    after. A pre-hook: recomputation stops early, inside the layer, once backward has what
    it needs."""
    calls = []
    layer = policy.model.get_decoder().layers[0]
    handle = layer.register_forward_pre_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    policy.train(token_batch(batch=4, seed=7), NLLLossFn(), gbs=4, mbs=2)
    handle.remove()
    return sum(calls), params_of(policy)


def test_activation_checkpointing_recomputes_and_gives_the_same_step(tiny_model_dir: Path):
    plain, checkpointed = (
        layer_calls_in_one_step(
            make_policy(
                policy_config(tiny_model_dir, dtensor_cfg={"activation_checkpointing": on}),
                init_reference_model=False,
            )
        )
        for on in (False, True)
    )
    assert plain[0] == 2 and checkpointed[0] == 4  # each microbatch's layer ran again in backward
    assert max_param_diff(plain[1], checkpointed[1]) < 1e-6


CHAT = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("tokenizer", "rendered"),
    [
        ({}, "<|im_start|>user\nhi<|im_end|>\n"),  # absent: the tokenizer's own template
        ({"chat_template": "default"}, "<|im_start|>user\nhi<|im_end|>\n"),
        ({"chat_template": None}, "hi"),  # null: NeMo RL's passthrough
        ({"chat_template": "{{ messages[0]['content'] | upper }}"}, "HI"),
        (
            {
                "chat_template": "{{ messages[0]['content'] }}{% if shout %}!{% endif %}",
                "chat_template_kwargs": {"shout": True},
            },
            "hi!",
        ),
    ],
)
def test_tokenizer_keys_act_as_nemo_rl_get_tokenizer(
    tiny_model_dir: Path, tokenizer: dict[str, Any], rendered: str
) -> None:
    loaded = load_tokenizer(policy_config(tiny_model_dir, tokenizer=tokenizer))
    assert loaded.apply_chat_template(CHAT, tokenize=False) == rendered


def test_sft_steps_drive_nll_down(tiny_model_dir: Path) -> None:
    data = token_batch(batch=4, seed=7)
    policy = make_policy(policy_config(tiny_model_dir))
    losses = [policy.train(data, NLLLossFn())["loss"].item() for _ in range(6)]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < losses[0] * 0.9, losses


def test_grpo_steps_raise_positive_advantage_logprobs(tiny_model_dir: Path) -> None:
    data = token_batch(batch=4, seed=11)
    policy = make_policy(policy_config(tiny_model_dir, train_micro_batch_size=1))
    sign = torch.tensor([1.0, 1.0, -1.0, -1.0])
    start = policy.get_logprobs(data)["logprobs"]
    data["advantages"] = sign.unsqueeze(1).expand_as(start).clone()
    data["prev_logprobs"] = start
    data["generation_logprobs"] = start
    data["reference_policy_logprobs"] = policy.get_reference_policy_logprobs(data)[
        "reference_logprobs"
    ]
    loss_fn = ClippedPGLossFn({"reference_policy_kl_penalty": 0.01})
    for _ in range(3):
        policy.train(data, loss_fn)
    end = policy.get_logprobs(data)["logprobs"]
    mask = data["token_mask"]
    change = ((end - start) * mask).sum(1) / mask.sum(1)
    assert (change[:2] > 0).all(), change
    assert (change[2:] < 0).all(), change


def test_checkpoint_resume_continues_bit_exactly(tiny_model_dir: Path, tmp_path: Path) -> None:
    schedule = {
        "scheduler": [
            {
                "name": "torch.optim.lr_scheduler.LinearLR",
                "kwargs": {"start_factor": 0.1, "total_iters": 3},
            },
            {"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0}},
            {"milestones": [3]},
        ]
    }
    config = policy_config(tiny_model_dir, **schedule)
    batches = [token_batch(batch=4, seed=s) for s in range(4)]
    straight = make_policy(config)
    for data in batches:
        straight.train(data, NLLLossFn())

    first = make_policy(config)
    for data in batches[:2]:
        first.train(data, NLLLossFn())
    first.save_checkpoint(tmp_path / "weights", tmp_path / "optim", tmp_path / "tok")
    resumed = make_policy(
        config, weights_path=tmp_path / "weights", optimizer_path=tmp_path / "optim"
    )
    for data in batches[2:]:
        resumed.train(data, NLLLossFn())
    assert max_param_diff(params_of(straight), params_of(resumed)) == 0.0
    assert resumed.current_lr() == straight.current_lr()
    assert (tmp_path / "tok" / "tokenizer_config.json").is_file()


def test_checkpoint_is_a_plain_hf_directory(tiny_model_dir: Path, tmp_path: Path, batch) -> None:
    policy = make_policy(policy_config(tiny_model_dir))
    policy.train(batch, NLLLossFn())
    policy.save_checkpoint(tmp_path / "hf")
    for name in ("config.json", "model.safetensors", "generation_config.json"):
        assert (tmp_path / "hf" / name).is_file(), name
    AutoTokenizer.from_pretrained(tmp_path / "hf")
    torch.testing.assert_close(
        manual_logprobs(tmp_path / "hf", batch),
        policy.get_logprobs(batch)["logprobs"],
        atol=1e-5,
        rtol=0,
    )


class NaNLoss:
    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.LOGPROB

    def __call__(self, data, global_valid_seqs, global_valid_toks, next_token_logprobs):
        return next_token_logprobs.sum() * float("nan"), {}


class InfGradLoss(NaNLoss):
    def __call__(self, data, global_valid_seqs, global_valid_toks, next_token_logprobs):
        # Value 0, gradient sqrt'(0) = inf: a finite loss with a non-finite gradient.
        return (next_token_logprobs - next_token_logprobs.detach()).abs().sqrt().sum(), {}


@pytest.mark.parametrize("loss_fn", [NaNLoss(), InfGradLoss()])
def test_non_finite_loss_or_grad_skips_the_step(tiny_model_dir: Path, batch, loss_fn: Any) -> None:
    policy = make_policy(policy_config(tiny_model_dir))
    before = params_of(policy)
    with pytest.raises(NonFiniteTrainingError, match="optimizer step was skipped"):
        policy.train(batch, loss_fn)
    assert max_param_diff(before, params_of(policy)) == 0.0


def test_bfloat16_is_close_to_float32_and_deterministic(tiny_model_dir: Path, batch) -> None:
    fp32 = make_policy(policy_config(tiny_model_dir), init_optimizer=False)
    runs = []
    for _ in range(2):
        bf16 = make_policy(policy_config(tiny_model_dir, precision="bfloat16"))
        bf16.train(batch, NLLLossFn())
        runs.append((bf16.get_logprobs(batch)["logprobs"], params_of(bf16)))
    assert torch.equal(runs[0][0], runs[1][0])
    assert max_param_diff(runs[0][1], runs[1][1]) == 0.0
    bf16_fresh = make_policy(policy_config(tiny_model_dir, precision="bfloat16"))
    diff = (bf16_fresh.get_logprobs(batch)["logprobs"] - fp32.get_logprobs(batch)["logprobs"]).abs()
    assert diff.max() < 0.1
    assert all(p.dtype == torch.float32 for p in bf16_fresh.model.parameters())
    assert all(t.dtype == torch.bfloat16 for t in bf16_fresh.state_dict_for_refit().values())


def test_refit_info_describes_the_refit_state_dict(tiny_model_dir: Path) -> None:
    policy = make_policy(policy_config(tiny_model_dir), init_optimizer=False)
    info = policy.prepare_refit_info()
    weights = policy.state_dict_for_refit()
    assert set(info) == set(weights)
    assert all(info[k] == (tuple(v.shape), v.dtype) for k, v in weights.items())
    assert "model.embed_tokens.weight" in weights
    with pytest.raises(NotImplementedError, match="state_dict_for_refit"):
        policy.broadcast_weights_for_collective()


def test_fp8_calibration_uses_the_percentile_of_each_projection(
    tiny_model_dir: Path, batch
) -> None:
    policy = make_policy(policy_config(tiny_model_dir), init_optimizer=False)
    scales = policy.calibrate_qkv_fp8_scales(batch, micro_batch_size=8, percentile=90.0, margin=2.0)
    assert set(scales["layers"]) == {"model.layers.0.self_attn", "model.layers.1.self_attn"}
    assert set(scales["layers"]["model.layers.0.self_attn"]) == {"k_scale", "v_scale"}
    captured = {}
    layer = policy.model.model.layers[0].self_attn
    handle = layer.k_proj.register_forward_hook(lambda m, i, o: captured.setdefault("k", o))
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    valid = torch.arange(ids.shape[1]).unsqueeze(0) < lengths.unsqueeze(1)
    with torch.no_grad():
        policy.model(input_ids=ids, attention_mask=valid.long())
    handle.remove()
    expected = torch.quantile(captured["k"][valid].abs().flatten(), 0.9).item() * 2.0 / 448.0
    assert scales["layers"]["model.layers.0.self_attn"]["k_scale"] == pytest.approx(
        expected, rel=1e-2
    )
    with_q = policy.calibrate_qkv_fp8_scales(batch, include_q=True)
    assert "q_scale" in with_q["layers"]["model.layers.1.self_attn"]


def test_bad_inputs_fail_with_clear_errors(tiny_model_dir: Path, tmp_path: Path) -> None:
    empty = tmp_path / "no-weights"
    empty.mkdir()
    (empty / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="no \\*.safetensors"):
        make_policy(policy_config(empty))

    bigger = build_tiny_model(tmp_path / "bigger", vocab_size=700)
    with pytest.raises(VocabMismatchError, match="embedding has"):
        make_policy(policy_config(tiny_model_dir), tokenizer=AutoTokenizer.from_pretrained(bigger))

    policy = make_policy(policy_config(tiny_model_dir), init_optimizer=False)
    out_of_vocab = token_batch(batch=2)
    out_of_vocab["input_ids"][0, 1] = 10_000
    with pytest.raises(VocabMismatchError, match="10000"):
        policy.get_logprobs(out_of_vocab)

    too_long = token_batch(batch=2, seq=40)
    with pytest.raises(ValueError, match="max_total_sequence_length=32"):
        policy.get_logprobs(too_long)


def test_make_policy_takes_a_plain_dict_and_no_sample_mask(tiny_model_dir: Path) -> None:
    data = token_batch(batch=4)
    del data["sample_mask"]
    with pytest.raises(ConfigError, match="train_micro_batch_sizes: unknown key"):
        make_policy({**policy_config(tiny_model_dir).model_dump(), "train_micro_batch_sizes": 2})
    policy = make_policy(policy_config(tiny_model_dir).model_dump(by_alias=True))
    assert isinstance(policy, HFPolicy)
    metrics = policy.train(BatchedDataDict(data), NLLLossFn())
    assert metrics["global_valid_seqs"] == 4


def test_automodel_kwargs_attn_implementation_reaches_from_pretrained(tiny_model_dir) -> None:
    """NeMo RL hands automodel_kwargs.attn_implementation to from_pretrained; so does the
    loader here (sdpa otherwise), and both compute the same log-probs."""
    from nemo_rl_core.models.policy.hf_loading import load_pretrained

    eager = policy_config(
        tiny_model_dir, dtensor_cfg={"automodel_kwargs": {"attn_implementation": "eager"}}
    )
    models = [
        load_pretrained(AutoModelForCausalLM, tiny_model_dir, config)
        for config in (eager, policy_config(tiny_model_dir))
    ]
    assert [m.config._attn_implementation for m in models] == ["eager", "sdpa"]
    ids = torch.randint(0, 500, (2, 12))
    torch.testing.assert_close(models[0](ids).logits, models[1](ids).logits, atol=1e-5, rtol=0)
