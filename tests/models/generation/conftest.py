"""Fixtures for the generation tests: prompt batches and a reference logprob check."""

from collections.abc import Callable

import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

PROMPTS = [
    "what is the sum of 3 and 4",
    "solve the problem step by step",
    "hi",
    "the answer is",
    "user: please reason carefully about the board",
    "7 * 8 =",
    "move the tile left",
    "you are a helpful assistant",
]


def prompt_batch(tokenizer, texts: list[str] = PROMPTS, **extra) -> BatchedDataDict:
    """Right-padded prompts as NeMo RL's rollouts hand them to generate()."""
    encoded = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(e) for e in encoded)
    input_ids = torch.tensor([e + [tokenizer.pad_token_id] * (width - len(e)) for e in encoded])
    return BatchedDataDict(
        {"input_ids": input_ids, "input_lengths": torch.tensor([len(e) for e in encoded]), **extra}
    )


@pytest.fixture
def make_batch() -> Callable[..., BatchedDataDict]:
    return prompt_batch


def _manual_logprobs(
    model,
    output: BatchedDataDict,
    prompt_lengths: torch.Tensor,
    temperature: float,
    top_k: int | None,
) -> list[torch.Tensor]:
    """Logprobs of the generated tokens from a plain forward: logits / T, top-k, log_softmax."""
    per_sample = []
    with torch.no_grad():
        for row, end in enumerate(output["unpadded_sequence_lengths"].tolist()):
            start = int(prompt_lengths[row])
            sequence = output["output_ids"][row, :end].to(model.device)
            logits = model(sequence[None]).logits[0].float() / temperature
            if top_k is not None:
                kth = logits.topk(top_k, dim=-1).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            logprobs = torch.log_softmax(logits, dim=-1)[start - 1 : end - 1]
            per_sample.append(logprobs.gather(-1, sequence[start:end, None])[:, 0].cpu())
    return per_sample


@pytest.fixture
def logprob_gap() -> Callable[..., tuple[float, float]]:
    """(max, mean) |generation logprob - manual forward logprob| over generated tokens."""

    def gap(
        model, output, prompt_lengths, temperature: float = 1.0, top_k: int | None = None
    ) -> tuple[float, float]:
        reference = _manual_logprobs(model, output, prompt_lengths, temperature, top_k)
        diffs = []
        for row, ref in enumerate(reference):
            start = int(prompt_lengths[row])
            diffs.append((ref - output["logprobs"][row, start : start + len(ref)]).abs())
        all_diffs = torch.cat(diffs)
        return all_diffs.max().item(), all_diffs.mean().item()

    return gap
