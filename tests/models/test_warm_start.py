"""The warm start of tiny-llama-arith: the careless teacher's sums, the SFT loop, and prompts
that match what the GRPO run of the example config renders."""

import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_rl_core.algorithms.grpo import load_master_config
from nemo_rl_core.algorithms.grpo_config import data_setup
from nemo_rl_core.data.datasets.builder import build_dataset, load_rows
from nemo_rl_core.data.datasets.generators import addition_problems
from nemo_rl_core.models.local_models import ModelNotFoundError, resolve_model, train_tokenizer
from nemo_rl_core.models.warm_start import (
    answer_token_ids,
    prompt_token_ids,
    sum_without_carries,
    supervised_train,
)

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "grpo_addition_tiny.yaml"


@pytest.mark.parametrize(
    ("a", "b", "careless"), [(27, 15, 32), (85, 94, 79), (99, 99, 88), (55, 55, 0), (12, 34, 46)]
)
def test_the_careless_teacher_drops_every_carry(a, b, careless):
    assert sum_without_carries(a, b) == careless


def test_sft_prompts_are_the_grpo_runs_prompts():
    """SFT renders prompts itself; a prompt or system prompt file added to the example
    config would make the run's prompts ones the model never saw."""
    rows = addition_problems(64, seed=0)
    tokenizer = train_tokenizer(
        300, corpus=[r["problem"] + " \\boxed{1}" for r in rows], split_digits=True
    )
    config = load_master_config(str(CONFIG))
    setup = data_setup(config)
    dataset = build_dataset(config.data, tokenizer, setup=setup)
    for index, row in enumerate(load_rows(config.data, setup=setup)[:3]):
        run_prompt = [int(t) for m in dataset[index]["message_log"] for t in m["token_ids"]]
        assert run_prompt == prompt_token_ids(row["problem"], tokenizer)
    answer = tokenizer.convert_ids_to_tokens(answer_token_ids(107, tokenizer))
    assert answer[-5:] == ["1", "0", "7", "}", tokenizer.eos_token]


def test_supervised_train_teaches_the_response(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = tokenizer("what is one plus one", add_special_tokens=False)["input_ids"]
    example = (prompt, answer_token_ids(2, tokenizer))
    torch.manual_seed(0)
    losses = supervised_train(
        model,
        lambda rng: example,
        tokenizer.pad_token_id,
        random.Random(0),
        steps=100,
        lr=3e-3,
        cosine=False,
        batch_size=4,
    )
    assert losses[-1] < 0.05 < losses[0]
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=8,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    assert tokenizer.decode(out[0, len(prompt) :], skip_special_tokens=True) == "\\boxed{2}"


def test_unknown_names_list_the_trained_model(tmp_path):
    with pytest.raises(ModelNotFoundError, match="tiny-llama-arith"):
        resolve_model("tiny-llama-arithmetic", cache_dir=tmp_path)
