"""Turning a ``GenerationDatumSpec`` batch into prompts and responses back into outputs.

Shared by the vLLM and HF backends so both check inputs the same way and lay out
``output_ids``/``logprobs`` exactly as NeMo RL's vLLM worker does: each row is the
unpadded prompt followed by its response, right-padded to
``padded_prompt_width + longest_response``; logprobs are 0 outside the response.
"""

from dataclasses import dataclass

import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.models.generation.config import GenerationConfig
from nemo_rl_core.models.generation.interfaces import GenerationDatumSpec, GenerationOutputSpec


class PromptTooLongError(ValueError):
    """A prompt leaves no room for even one generated token within max_model_len."""


def unpad_prompts(data: BatchedDataDict[GenerationDatumSpec], vocab_size: int) -> list[list[int]]:
    """The valid tokens of each right-padded prompt, checked against the vocabulary."""
    input_ids, lengths = data["input_ids"], data["input_lengths"]
    if input_ids.dim() != 2 or lengths.shape != (input_ids.shape[0],):
        raise ValueError(
            f"input_ids must be [batch, seq] and input_lengths [batch], got "
            f"{tuple(input_ids.shape)} and {tuple(lengths.shape)}"
        )
    prompts = []
    for row, length in enumerate(lengths.tolist()):
        if not 1 <= length <= input_ids.shape[1]:
            raise ValueError(
                f"input_lengths[{row}]={length} must be in 1..{input_ids.shape[1]} "
                "(the padded prompt width); empty prompts cannot be generated from"
            )
        prompt = input_ids[row, :length].tolist()
        out_of_range = [t for t in prompt if not 0 <= t < vocab_size]
        if out_of_range:
            raise ValueError(
                f"prompt {row} holds token ids {out_of_range[:5]} outside the model's vocabulary "
                f"[0, {vocab_size}); was it tokenized with a different tokenizer?"
            )
        prompts.append(prompt)
    return prompts


def generation_budgets(
    prompt_lengths: list[int], max_new_tokens: int, max_model_len: int
) -> list[int]:
    """Per-prompt ``max_tokens``: max_new_tokens, cut to what is left of max_model_len.

    The cut is NeMo RL's documented behaviour for long multi-turn prompts (the response
    ends with ``generation_lengths < max_new_tokens``); a prompt with no room left is an
    error rather than an empty response.
    """
    budgets = []
    for row, length in enumerate(prompt_lengths):
        if length >= max_model_len:
            raise PromptTooLongError(
                f"prompt {row} has {length} tokens but max_model_len is {max_model_len}, "
                "leaving no room to generate; shorten or filter the prompt "
                "(max_input_seq_length) or raise vllm_cfg.max_model_len"
            )
        budgets.append(min(max_new_tokens, max_model_len - length))
    return budgets


def stop_strings_per_sample(
    data: BatchedDataDict[GenerationDatumSpec], default: list[str] | None
) -> list[list[str] | None]:
    """The config's stop strings plus each sample's own (``data["stop_strings"]``)."""
    batch_size = data["input_ids"].shape[0]
    per_sample = data.get("stop_strings") or [None] * batch_size
    if len(per_sample) != batch_size:
        raise ValueError(
            f"data['stop_strings'] has {len(per_sample)} entries for a batch of {batch_size}"
        )
    merged = []
    for own in per_sample:
        strings = list(dict.fromkeys([*(default or []), *(own or [])]))
        merged.append(strings or None)
    return merged


def pack_generation_outputs(
    data: BatchedDataDict[GenerationDatumSpec],
    responses: list[list[int]],
    response_logprobs: list[list[float]],
    pad_token_id: int,
    truncated: list[bool],
) -> BatchedDataDict[GenerationOutputSpec]:
    """Right-padded prompt+response rows with generation logprobs aligned to them;
    ``truncated`` marks responses that hit their token budget without a stop."""
    input_ids, lengths = data["input_ids"], data["input_lengths"].tolist()
    width = input_ids.shape[1] + max((len(r) for r in responses), default=0)
    output_ids = torch.full((len(responses), width), pad_token_id, dtype=input_ids.dtype)
    logprobs = torch.zeros((len(responses), width), dtype=torch.float32)
    for row, (length, response, lps) in enumerate(
        zip(lengths, responses, response_logprobs, strict=True)
    ):
        end = length + len(response)
        output_ids[row, :length] = input_ids[row, :length]
        output_ids[row, length:end] = torch.tensor(response, dtype=input_ids.dtype)
        logprobs[row, length:end] = torch.tensor(lps, dtype=torch.float32)
    generation_lengths = torch.tensor([len(r) for r in responses], dtype=torch.long)
    return BatchedDataDict[GenerationOutputSpec](
        {
            "output_ids": output_ids,
            "logprobs": logprobs,
            "generation_lengths": generation_lengths,
            "unpadded_sequence_lengths": torch.tensor(lengths, dtype=torch.long)
            + generation_lengths,
            "truncated": torch.tensor(truncated, dtype=torch.bool),
        }
    )


@dataclass(frozen=True)
class GenerationRequests:
    """One request per sample: unpadded prompt, token budget and stop strings."""

    prompts: list[list[int]]
    max_tokens: list[int]
    stop_strings: list[list[str] | None]


def build_requests(
    data: BatchedDataDict[GenerationDatumSpec],
    config: GenerationConfig,
    vocab_size: int,
    max_model_len: int,
) -> GenerationRequests:
    """Check a batch and turn it into per-sample requests, the same way for every backend."""
    prompts = unpad_prompts(data, vocab_size)
    return GenerationRequests(
        prompts=prompts,
        max_tokens=generation_budgets(
            [len(p) for p in prompts], config.max_new_tokens, max_model_len
        ),
        stop_strings=stop_strings_per_sample(data, config.stop_strings),
    )
