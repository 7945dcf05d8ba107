"""MegatronPolicy (world size 1, in-process) against HFPolicy on the same weights and data."""

from pathlib import Path

import pytest
import torch
from conftest import LR, make_batch, policy_config
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from nemo_rl_core.algorithms.loss import ClippedPGLossFn, LossInputType, LossType, NLLLossFn
from nemo_rl_core.algorithms.utils import calculate_global_valid_counts
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.models.policy.hf_policy import HFPolicy
from nemo_rl_core.models.policy.megatron_policy import MegatronPolicy

pytestmark = pytest.mark.megatron


@pytest.fixture(scope="module")
def megatron_policy(tiny_model_dir: Path) -> MegatronPolicy:
    policy = make_policy(policy_config(tiny_model_dir, "megatron"))
    assert isinstance(policy, MegatronPolicy)
    yield policy
    policy.shutdown()


@pytest.fixture(scope="module")
def hf_policy(tiny_model_dir: Path) -> HFPolicy:
    return HFPolicy(policy_config(tiny_model_dir, "hf"))


def test_logprobs_match_hf(megatron_policy, hf_policy, vocab_size) -> None:
    data = make_batch(vocab_size)
    got = megatron_policy.get_logprobs(data)["logprobs"]
    want = hf_policy.get_logprobs(data)["logprobs"]
    assert got.shape == want.shape == data["input_ids"].shape
    assert torch.count_nonzero(want) > 0
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_logprobs_match_plain_transformers(megatron_policy, tiny_model_dir, vocab_size) -> None:
    data = make_batch(vocab_size, seed=3)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(data["input_ids"]).logits
    want = torch.log_softmax(logits[:, :-1], -1).gather(-1, data["input_ids"][:, 1:, None])[..., 0]
    valid = torch.arange(12)[None, 1:] < data["input_lengths"][:, None]
    got = megatron_policy.get_logprobs(data)["logprobs"][:, 1:]
    torch.testing.assert_close(got[valid], want[valid], atol=1e-5, rtol=0)
    assert torch.all(got[~valid] == 0)


def test_topk_and_reference_match_hf(megatron_policy, hf_policy, vocab_size) -> None:
    data = make_batch(vocab_size, seed=1)
    got = megatron_policy.get_topk_logits(data, k=5)
    want = hf_policy.get_topk_logits(data, k=5)
    torch.testing.assert_close(got["topk_logits"], want["topk_logits"], atol=1e-5, rtol=0)
    assert torch.equal(got["topk_indices"], want["topk_indices"])
    ref = megatron_policy.get_reference_policy_logprobs(data)["reference_logprobs"]
    torch.testing.assert_close(
        ref, hf_policy.get_reference_policy_logprobs(data)["reference_logprobs"], atol=1e-5, rtol=0
    )


def test_hf_config_overrides_shape_both_backends_alike(tiny_model_dir, hf_policy, vocab_size):
    data = make_batch(vocab_size, seed=2)
    logprobs = []
    for backend in ("megatron", "hf"):
        config = policy_config(tiny_model_dir, backend).model_copy(
            update={"hf_config_overrides": {"rms_norm_eps": 0.5}}
        )
        policy = make_policy(config, init_optimizer=False, init_reference_model=False)
        logprobs.append(policy.get_logprobs(data)["logprobs"])
        policy.shutdown()
    torch.testing.assert_close(logprobs[0], logprobs[1], atol=1e-5, rtol=0)
    plain = hf_policy.get_logprobs(data)["logprobs"]
    assert (logprobs[0] - plain).abs().max() > 1e-3


@pytest.mark.skipif(torch.cuda.is_available(), reason="on GPU megatron-core offloads for real")
def test_optimizer_cpu_offload_is_moot_without_cuda(tiny_model_dir, vocab_size) -> None:
    """Everything already sits in host memory: the same step, where megatron-core's offload
    would have asked CUDA for streams."""
    losses = []
    for offload in (False, True):
        optimizer = {"lr": LR, "min_lr": LR, "weight_decay": 0.0, "clip_grad": 1.0}
        optimizer |= {"optimizer_cpu_offload": offload, "optimizer_offload_fraction": 1.0}
        policy = make_policy(policy_config(tiny_model_dir, "megatron", optimizer=optimizer))
        policy.train(make_batch(vocab_size, seed=4), NLLLossFn())
        losses.append(policy.train(make_batch(vocab_size, seed=5), NLLLossFn())["loss"])
        policy.shutdown()
    torch.testing.assert_close(losses[0], losses[1], atol=0, rtol=0)


@pytest.mark.parametrize("loss_fn", [ClippedPGLossFn({}), NLLLossFn()], ids=["pg", "nll"])
def test_train_step_matches_hf(tiny_model_dir, vocab_size, tmp_path, loss_fn) -> None:
    """Same batch, loss, AdamW settings: same loss and, to 1e-4, the same updated weights."""
    data = make_batch(vocab_size, seed=2)
    megatron = MegatronPolicy(policy_config(tiny_model_dir, "megatron"))
    hf = HFPolicy(policy_config(tiny_model_dir, "hf"))
    try:
        got = megatron.train(data, loss_fn)
        want = hf.train(data, loss_fn)
        torch.testing.assert_close(got["loss"], want["loss"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["grad_norm"], want["grad_norm"], atol=1e-4, rtol=1e-4)
        megatron.save_checkpoint(tmp_path / "megatron")
        hf.save_checkpoint(tmp_path / "hf")
    finally:
        megatron.shutdown()
    got_w = load_file(tmp_path / "megatron" / "model.safetensors")
    want_w = load_file(tmp_path / "hf" / "model.safetensors")
    assert set(got_w) == set(want_w)
    base = load_file(tiny_model_dir / "model.safetensors")
    moved = sum(not torch.equal(got_w[k], base[k]) for k in got_w)
    assert moved == len(got_w), "every tensor should have been updated"
    for key in want_w:
        torch.testing.assert_close(got_w[key], want_w[key], atol=1e-4, rtol=0, msg=key)


def test_checkpoint_resumes_exactly_and_loads_in_transformers(
    tiny_qwen2_dir, tmp_path, monkeypatch
) -> None:
    """Save after step 1, restore weights + optimizer in a new policy: step 2 is the same."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(tiny_qwen2_dir).vocab_size
    data = make_batch(vocab, seed=5)
    loss_fn = NLLLossFn()
    config = policy_config(tiny_qwen2_dir, "megatron")
    first = MegatronPolicy(config)
    try:
        first.train(data, loss_fn)
        first.save_checkpoint(tmp_path / "weights", optimizer_path=tmp_path / "optim")
        saved_logprobs = first.get_logprobs(data)["logprobs"]
        continued = first.train(data, loss_fn)
        continued_logprobs = first.get_logprobs(data)["logprobs"]
    finally:
        first.shutdown()
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "weights", dtype=torch.float32)
    with torch.no_grad():
        logits = model(data["input_ids"]).logits
    hf_lp = torch.log_softmax(logits[:, :-1], -1).gather(-1, data["input_ids"][:, 1:, None])[..., 0]
    valid = torch.arange(data["input_ids"].shape[1])[None, 1:] < data["input_lengths"][:, None]
    torch.testing.assert_close(hf_lp[valid], saved_logprobs[:, 1:][valid], atol=1e-5, rtol=0)

    resumed = MegatronPolicy(
        config, weights_path=tmp_path / "weights", optimizer_path=tmp_path / "optim"
    )
    try:
        torch.testing.assert_close(resumed.get_logprobs(data)["logprobs"], saved_logprobs)
        again = resumed.train(data, loss_fn)
        torch.testing.assert_close(again["loss"], continued["loss"], atol=1e-6, rtol=0)
        torch.testing.assert_close(
            resumed.get_logprobs(data)["logprobs"], continued_logprobs, atol=1e-6, rtol=0
        )
        # The reference stays the base model, as in NeMo RL.
        base = MegatronPolicy(config, init_optimizer=False)
        try:
            torch.testing.assert_close(
                resumed.get_reference_policy_logprobs(data)["reference_logprobs"],
                base.get_logprobs(data)["logprobs"],
            )
        finally:
            base.shutdown()
    finally:
        resumed.shutdown()


def test_bfloat16_trains_with_fp32_master_weights(tiny_model_dir, hf_policy, vocab_size) -> None:
    """precision: bfloat16 runs Megatron's Float16Module + fp32 main-param optimizer path."""
    config = policy_config(tiny_model_dir, "megatron").model_copy(update={"precision": "bfloat16"})
    data = make_batch(vocab_size, seed=6)
    policy = MegatronPolicy(config)
    try:
        logprobs = policy.get_logprobs(data)["logprobs"]
        fp32 = hf_policy.get_logprobs(data)["logprobs"]
        torch.testing.assert_close(logprobs, fp32, atol=5e-2, rtol=0)
        assert not torch.equal(logprobs, fp32), "bf16 compute should differ from fp32"
        losses = [float(policy.train(data, NLLLossFn())["loss"][0]) for _ in range(3)]
        assert losses[2] < losses[0]
    finally:
        policy.shutdown()


class _TokenMeanNLL:
    """NLL over the next-token positions the batch marks (every real token's without a
    ``token_mask``), normalized by the trainer's global token count: its value shows which
    normaliser a backend used."""

    loss_type = LossType.TOKEN_LEVEL
    input_type = LossInputType.LOGPROB

    def __call__(self, next_token_logprobs, data, global_valid_seqs, global_valid_toks):
        if "token_mask" in data:
            mask = data["token_mask"][:, 1:]
        else:
            positions = torch.arange(1, data["input_ids"].shape[1])
            mask = (positions[None] < data["input_lengths"][:, None]).float()
        loss = -(next_token_logprobs * mask).sum() / global_valid_toks
        return loss, {"loss": loss.item()}


@pytest.mark.parametrize("with_token_mask", [True, False], ids=["token_mask", "no_token_mask"])
def test_backends_share_one_loss_normaliser(tiny_model_dir, vocab_size, with_token_mask) -> None:
    data = make_batch(vocab_size, seed=5)
    if not with_token_mask:
        del data["token_mask"]
    megatron = MegatronPolicy(policy_config(tiny_model_dir, "megatron"))
    hf = HFPolicy(policy_config(tiny_model_dir, "hf"))
    try:
        got = megatron.train(data, _TokenMeanNLL(), eval_mode=True)
        want = hf.train(data, _TokenMeanNLL(), eval_mode=True)
    finally:
        megatron.shutdown()
    torch.testing.assert_close(got["loss"], want["loss"], atol=1e-5, rtol=1e-5)
    seqs, toks = calculate_global_valid_counts(data)
    # without a token mask every position after the first counts: seqs * (S - 1)
    expected_toks = toks if with_token_mask else seqs * (data["input_ids"].shape[1] - 1)
    assert want["global_valid_toks"] == pytest.approx(float(expected_toks))
