"""``tiny-llama-arith``: a tiny Llama that adds two-digit numbers but learned to forget carries.

GRPO needs a policy that is sometimes right: a random model never earns a reward, so its
gradient is zero. NeMo RL's recipes start RL from an SFT checkpoint; this is that recipe in
small, built here in 1-2 minutes of CPU. A digit-level tokenizer and a 2-layer Llama are
built, then a plain torch loop trains them in two phases on the training split of
``addition_problems`` (held-out pairs are never seen):

1. correct answers ``\\boxed{a+b}`` until the model adds, carries included (the skill);
2. demonstrations of a careless teacher who, on ``FORGET_CARRY`` of its answers, adds column
   by column and drops every carry (27 + 15 -> 32): a habit imitation learns.

The result answers greedily the careless way on most problems that need a carry (about a
third of held-out problems right) while its samples hold the right sum often enough that
GRPO's groups have mixed rewards: the verifier's reward can remove the habit. Training on
the careless data alone is no shortcut: its minority of correct carries makes the model
learn carrying late, after 400 to 1500 steps depending on the seed. Everything is seeded,
so one build version gives the same weights on the same machine.
"""

import logging
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nemo_rl_core.data.datasets.generators import (
    addition_answer,
    addition_pairs,
    addition_question,
)
from nemo_rl_core.data.interfaces import UNCAPPED_LENGTH, TaskDataSpec
from nemo_rl_core.data.processors import math_data_processor
from nemo_rl_core.models.tiny_models import build_tiny_model, train_tokenizer

# Bumped whenever build_addition_model's output changes, so a cached older build is not reused.
ADDITION_BUILD_VERSION = 1
NUM_PAIRS = 4096  # training pairs the tokenizer and both phases draw from
TOKENIZER_VOCAB = 320
BATCH_SIZE = 64
WARMUP_STEPS = 50
CORRECT_STEPS, CORRECT_LR = 500, 3e-3  # constant after warm-up: carrying is learned by ~450
CARELESS_STEPS, CARELESS_LR = 400, 2e-3  # cosine decay: settles on the teacher's mixture
FORGET_CARRY = 0.7

Example = tuple[list[int], list[int]]
logger = logging.getLogger(__name__)


def sum_without_carries(a: int, b: int) -> int:
    """Column-wise digit sums, each taken mod 10: the careless teacher's answer."""
    total, place = 0, 1
    while a or b:
        total += (a % 10 + b % 10) % 10 * place
        a, b, place = a // 10, b // 10, place * 10
    return total


def prompt_token_ids(question: str, tokenizer: Any) -> list[int]:
    """The prompt exactly as the GRPO run renders it: no prompt file, the chat template."""
    row = {"problem": question, "expected_answer": ""}
    datum = math_data_processor(row, TaskDataSpec(), tokenizer, UNCAPPED_LENGTH, 0)
    return [int(t) for message in datum["message_log"] for t in message["token_ids"]]


def answer_token_ids(answer: int, tokenizer: Any) -> list[int]:
    """The response the policy learns: the boxed answer, then the end of its turn."""
    ids = tokenizer(addition_answer(answer), add_special_tokens=False)["input_ids"]
    return [*ids, tokenizer.eos_token_id]


def _batch(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids`` and the mask of the positions that predict a response token."""
    length = max(len(p) + len(r) for p, r in examples)
    input_ids = torch.full((len(examples), length), pad_id)
    target_mask = torch.zeros(len(examples), length - 1)
    for i, (prompt, response) in enumerate(examples):
        input_ids[i, : len(prompt) + len(response)] = torch.tensor(prompt + response)
        target_mask[i, len(prompt) - 1 : len(prompt) + len(response) - 1] = 1.0
    return input_ids, target_mask


def supervised_train(
    model: torch.nn.Module,
    draw: Callable[[random.Random], Example],
    pad_id: int,
    rng: random.Random,
    *,
    steps: int,
    lr: float,
    cosine: bool,
    batch_size: int = BATCH_SIZE,
) -> list[float]:
    """SFT of ``model`` on examples from ``draw``: AdamW, linear warm-up, then constant or
    cosine decay to zero; cross-entropy on the response tokens only. Returns each step's loss."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    losses = []
    model.train()
    for step in range(steps):
        scale = min(1.0, (step + 1) / WARMUP_STEPS)
        if cosine:
            scale *= 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        input_ids, mask = _batch([draw(rng) for _ in range(batch_size)], pad_id)
        logits = model(input_ids=input_ids).logits[:, :-1]
        token_loss = torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), input_ids[:, 1:], reduction="none"
        )
        loss = (token_loss * mask).sum() / mask.sum()
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def build_addition_model(output_dir: str | Path, seed: int = 0) -> Path:
    """Build ``tiny-llama-arith`` in ``output_dir``: the tokenizer, a random Llama, then the
    two SFT phases (correct answers, then the careless teacher's)."""
    from transformers import AutoModelForCausalLM

    logger.info("building tiny-llama-arith in %s (SFT on CPU, 1-2 minutes, once)", output_dir)
    output_dir = Path(output_dir)
    pairs = addition_pairs(NUM_PAIRS, seed)
    questions = [addition_question(a, b) for a, b in pairs]
    corpus = [f"{q} {addition_answer(a + b)}" for q, (a, b) in zip(questions, pairs, strict=True)]
    tokenizer = train_tokenizer(
        TOKENIZER_VOCAB, corpus=[*corpus, "user assistant system"], split_digits=True
    )
    build_tiny_model(output_dir, "llama", seed=seed, tokenizer=tokenizer)
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    prompts = [prompt_token_ids(q, tokenizer) for q in questions]
    answers = [
        (answer_token_ids(a + b, tokenizer), answer_token_ids(sum_without_carries(a, b), tokenizer))
        for a, b in pairs
    ]

    def teacher(forget_carry: float) -> Callable[[random.Random], Example]:
        def draw(rng: random.Random) -> Example:
            index = rng.randrange(len(pairs))
            right, careless = answers[index]
            return prompts[index], careless if rng.random() < forget_carry else right

        return draw

    rng = random.Random(seed)
    torch.manual_seed(seed)
    pad = tokenizer.pad_token_id
    supervised_train(
        model, teacher(0.0), pad, rng, steps=CORRECT_STEPS, lr=CORRECT_LR, cosine=False
    )
    supervised_train(
        model, teacher(FORGET_CARRY), pad, rng, steps=CARELESS_STEPS, lr=CARELESS_LR, cosine=True
    )
    model.save_pretrained(output_dir)
    return output_dir


def build_addition_student(output_dir: str | Path, teacher_dir: Path, seed: int = 0) -> Path:
    """Build ``tiny-llama-arith-student``: a random Llama half as wide as ``tiny-llama-arith``
    (built at ``teacher_dir``), with its tokenizer (one vocabulary, as distillation needs),
    the student that ``examples/configs/distillation_tiny.yaml`` teaches from it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(teacher_dir)
    return build_tiny_model(
        output_dir,
        "llama",
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=128,
        seed=seed,
        tokenizer=tokenizer,
    )
