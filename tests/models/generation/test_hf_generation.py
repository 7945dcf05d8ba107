"""HFGeneration against plain forwards of the same model: tokens, logprobs, stops, refit."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_core.models.generation import GenerationConfig, make_generation
from nemo_rl_core.models.generation.hf_generation import HFGeneration
from nemo_rl_core.models.generation.model_files import RefitMismatchError
from nemo_rl_core.models.generation.sequences import PromptTooLongError

MAX_NEW = 10


def hf_config(**overrides) -> GenerationConfig:
    base = {
        "backend": "hf",
        "max_new_tokens": MAX_NEW,
        "temperature": 1.0,
        "vllm_cfg": {"precision": "float32", "max_model_len": 256},
    }
    return GenerationConfig.model_validate({**base, **overrides})


@pytest.fixture(scope="module")
def generator(tiny_model_dir: Path) -> HFGeneration:
    return make_generation(hf_config(), tiny_model_dir)


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def manual_greedy(model, prompt: list[int], steps: int, stop_ids: set[int]) -> list[int]:
    """Token-by-token argmax with full recomputation: the definition of greedy decoding."""
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(torch.tensor([sequence])).logits[0, -1].argmax())
            sequence.append(token)
            if token in stop_ids:
                break
    return sequence[len(prompt) :]


def response(output, data, row: int) -> list[int]:
    start = int(data["input_lengths"][row])
    return output["output_ids"][row, start : int(output["unpadded_sequence_lengths"][row])].tolist()


def test_greedy_matches_manual_argmax_and_layout(generator, reference, make_batch, logprob_gap):
    data = make_batch(generator.model_spec.tokenizer)
    out = generator.generate(data, greedy=True)
    width = data["input_ids"].shape[1] + int(out["generation_lengths"].max())
    assert out["output_ids"].shape == out["logprobs"].shape == (data.size, width)
    for row in range(data.size):
        length = int(data["input_lengths"][row])
        prompt = data["input_ids"][row, :length].tolist()
        assert out["output_ids"][row, :length].tolist() == prompt
        expected = manual_greedy(reference, prompt, MAX_NEW, set(generator.stop_token_ids))
        assert response(out, data, row) == expected
        end = int(out["unpadded_sequence_lengths"][row])
        assert (out["output_ids"][row, end:] == generator.cfg.pad_token_id).all()
        assert (out["logprobs"][row, :length] == 0).all() and (
            out["logprobs"][row, end:] == 0
        ).all()
    max_gap, _ = logprob_gap(reference, out, data["input_lengths"])
    assert max_gap < 1e-5


def test_sampled_logprobs_are_the_processed_distribution(
    tiny_model_dir, reference, make_batch, logprob_gap
):
    """temperature and top-k shape the distribution the logprobs come from (vLLM's processed_logprobs)."""
    sampler = HFGeneration(hf_config(temperature=0.7, top_k=20), tiny_model_dir, seed=3)
    data = make_batch(sampler.model_spec.tokenizer)
    out = sampler.generate(data)
    max_gap, _ = logprob_gap(reference, out, data["input_lengths"], temperature=0.7, top_k=20)
    assert max_gap < 1e-5
    raw_gap, _ = logprob_gap(reference, out, data["input_lengths"])
    assert raw_gap > 0.1, "logprobs must not be the raw (temperature 1) ones"


def test_same_seed_same_samples(tiny_model_dir, make_batch):
    first = HFGeneration(hf_config(), tiny_model_dir, seed=11)
    second = HFGeneration(hf_config(), tiny_model_dir, seed=11)
    data = make_batch(first.model_spec.tokenizer)
    a, b = first.generate(data), second.generate(data)
    assert torch.equal(a["output_ids"], b["output_ids"])
    assert not torch.equal(a["output_ids"], first.generate(data)["output_ids"])


def test_each_sample_draws_from_its_own_seed(tiny_model_dir, make_batch):
    """Rows are sampled with generators of their own: batches of ``batch_size`` rows make the
    same bits however the whole is handed in (two engines given halves, or one given all),
    and a sample's seed, not its neighbours, decides its tokens."""
    data = make_batch(
        make_generation(hf_config(), tiny_model_dir).model_spec.tokenizer,
        sample_seeds=torch.arange(100, 108),
    )
    whole = HFGeneration(hf_config(), tiny_model_dir, seed=1, batch_size=2).generate(data)
    halves = [
        HFGeneration(hf_config(), tiny_model_dir, seed=2, batch_size=2).generate(data.slice(a, b))
        for a, b in ((0, 4), (4, 8))
    ]
    for row in range(8):
        part, local = halves[row // 4], row % 4
        assert response(whole, data, row) == response(
            part, data.slice(row // 4 * 4, row // 4 * 4 + 4), local
        )
        start, end = int(data["input_lengths"][row]), int(whole["unpadded_sequence_lengths"][row])
        assert whole["logprobs"][row, start:end].equal(part["logprobs"][local, start:end])
    reseeded = data.slice(0, 2)
    reseeded["sample_seeds"] = torch.tensor([100, 999])
    again = HFGeneration(hf_config(), tiny_model_dir, batch_size=2).generate(reseeded)
    assert response(again, reseeded, 0) == response(whole, data, 0)
    assert response(again, reseeded, 1) != response(whole, data, 1)


def test_per_sample_stop_string_cuts_after_the_completing_token(generator, make_batch):
    tokenizer = generator.model_spec.tokenizer
    data = make_batch(tokenizer)
    free = generator.generate(data, greedy=True)
    tokens = response(free, data, 0)
    stop = tokenizer.decode(tokens[3:5], skip_special_tokens=True).strip()
    assert stop, "the greedy response should decode to text"
    stopped = generator.generate(
        make_batch(tokenizer, stop_strings=[[stop]] + [None] * (data.size - 1)), greedy=True
    )
    cut = response(stopped, data, 0)
    assert stop in tokenizer.decode(cut, skip_special_tokens=True)
    assert stop not in tokenizer.decode(cut[:-1], skip_special_tokens=True)
    assert cut == tokens[: len(cut)]
    for row in range(1, data.size):
        assert response(stopped, data, row) == response(free, data, row)


def test_stop_token_ids_end_the_response(tiny_model_dir, generator, make_batch):
    data = make_batch(generator.model_spec.tokenizer)
    tokens = response(generator.generate(data, greedy=True), data, 1)
    stopper = HFGeneration(hf_config(stop_token_ids=[tokens[2]]), tiny_model_dir)
    cut = response(stopper.generate(data, greedy=True), data, 1)
    assert cut == tokens[: tokens.index(tokens[2]) + 1]


def test_generate_stops_once_every_row_has_stopped(tiny_model_dir, generator, make_batch):
    """A padded batch computes finished rows until its longest is done, never longer: the
    forward passes are one prefill plus one per step of the longest response."""
    data = make_batch(generator.model_spec.tokenizer)
    free = generator.generate(data, greedy=True)
    # every row's second token stops it (or an earlier one): the longest response is <= 2
    stops = sorted({response(free, data, row)[1] for row in range(data.size)})
    stopper = HFGeneration(hf_config(stop_token_ids=stops), tiny_model_dir)
    forwards = []
    hook = stopper.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        out = stopper.generate(data, greedy=True)
    finally:
        hook.remove()
    longest = int(out["generation_lengths"].max())
    assert longest <= 2 < MAX_NEW
    assert len(forwards) == longest


def test_budget_is_cut_to_max_model_len_and_overlong_prompts_fail(tiny_model_dir, make_batch):
    short = HFGeneration(
        hf_config(max_new_tokens=8, vllm_cfg={"max_model_len": 18}), tiny_model_dir
    )
    data = make_batch(short.model_spec.tokenizer, ["what is the sum of 3 and 4", "hi"])
    lengths = data["input_lengths"].tolist()
    assert 10 < lengths[0] < 18, "the first prompt must leave less than max_new_tokens of room"
    out = short.generate(data, greedy=True)
    assert out["unpadded_sequence_lengths"][0] <= 18
    assert out["generation_lengths"][0] == 18 - lengths[0]
    too_long = make_batch(short.model_spec.tokenizer, ["what is the sum of 3 and 4 " * 4])
    with pytest.raises(PromptTooLongError, match="prompt 0 has .* tokens but max_model_len is 18"):
        short.generate(too_long)


def perturbed_state_dict(model_dir: Path, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """New weights, as a training step would produce: every parameter moved."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(123)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * parameter.std() * scale)
    return model.state_dict()


def test_refit_from_state_dict_and_checkpoint(tiny_model_dir, tmp_path, make_batch):
    generator = HFGeneration(hf_config(), tiny_model_dir)
    data = make_batch(generator.model_spec.tokenizer)
    before = generator.generate(data, greedy=True)
    new_weights = perturbed_state_dict(tiny_model_dir)
    generator.update_weights_from_state_dict(new_weights)
    after = generator.generate(data, greedy=True)
    assert not torch.equal(before["output_ids"], after["output_ids"])

    checkpoint = tmp_path / "step_1"
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.load_state_dict(new_weights)
    model.save_pretrained(checkpoint)
    generator.model_spec.tokenizer.save_pretrained(checkpoint)
    cold = HFGeneration(hf_config(), checkpoint).generate(data, greedy=True)
    assert torch.equal(after["output_ids"], cold["output_ids"])

    fresh = HFGeneration(hf_config(), tiny_model_dir)
    fresh.update_weights_from_checkpoint(checkpoint)
    assert torch.equal(fresh.generate(data, greedy=True)["output_ids"], after["output_ids"])


def test_refit_rejects_weights_that_do_not_fit(generator, tiny_model_dir):
    weights = perturbed_state_dict(tiny_model_dir)
    missing = {k: v for k, v in weights.items() if "layers.1." not in k}
    with pytest.raises(RefitMismatchError, match="missing"):
        generator.update_weights_from_state_dict(missing)
    wrong = dict(weights, **{"model.norm.weight": torch.ones(3)})
    with pytest.raises(RefitMismatchError, match="wrong shapes"):
        generator.update_weights_from_state_dict(wrong)
    untied = dict(weights, **{"lm_head.weight": weights["lm_head.weight"].clone() + 1})
    with pytest.raises(RefitMismatchError, match="lm_head.weight differs"):
        generator.update_weights_from_state_dict(untied)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        generator.update_weights_from_checkpoint(tiny_model_dir / "nowhere")
