"""Message-log helpers of NeMo RL (``nemo_rl.data.llm_message_utils``).

A rollout keeps one message log per sample: each turn holds its text and its own
``token_ids`` (assistant turns also ``generation_logprobs``). Training needs flat, padded
tensors. These helpers are the one bridge between the two, so token accounting stays exact:
the flat ``input_ids`` of a sample are the concatenation of its turns' ``token_ids``.

GRPO path after a rollout::

    add_loss_mask_to_message_log(batch["message_log"], roles_to_train_on=["assistant"])
    train_data = message_logs_to_train_data(batch["message_log"], tokenizer.pad_token_id)
    # -> input_ids, input_lengths, token_mask, generation_logprobs (all [B, S] / [B])
"""

from typing import Any

import torch

from nemo_rl_core.data.interfaces import FlatMessagesType, LLMMessageLogType, TaskDataSpec
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def message_log_to_flat_messages(message_log: LLMMessageLogType) -> FlatMessagesType:
    """Concatenate the turns of one conversation key by key.

    Tensor values (``token_ids``, ``generation_logprobs``, ``token_loss_mask``) are
    concatenated; other values (``role``, ``content``) become a list with one entry per turn.
    A tensor key present in only some turns would misalign positions, so it is refused.
    """
    collected: dict[str, list[Any]] = {}
    for message in message_log:
        for key, value in message.items():
            collected.setdefault(key, []).append(value)
    flat: FlatMessagesType = {}
    for key, values in collected.items():
        if any(isinstance(v, torch.Tensor) for v in values):
            if len(values) != len(message_log):
                missing = [i for i, m in enumerate(message_log) if key not in m]
                raise ValueError(
                    f"tensor key {key!r} is missing from messages {missing} of a "
                    f"{len(message_log)}-turn message log; give every turn a {key!r} "
                    "(e.g. zeros for turns that were not generated)"
                )
            flat[key] = torch.cat([torch.as_tensor(v).reshape(-1) for v in values])
        else:
            flat[key] = values
    return flat


def get_keys_from_message_log(message_log: LLMMessageLogType, keys: list[str]) -> LLMMessageLogType:
    """The same turns, keeping only ``keys`` (e.g. ``["role", "content"]`` for an API call)."""
    return [{key: message[key] for key in keys if key in message} for message in message_log]


def batched_message_log_to_flat_message(
    message_log_batch: list[LLMMessageLogType],
    pad_value_dict: dict[str, int | float] | None = None,
    make_sequence_length_divisible_by: int = 1,
) -> tuple[BatchedDataDict[FlatMessagesType], torch.Tensor]:
    """Flatten every conversation and right-pad each tensor key to one width.

    Returns the padded batch and ``input_lengths`` (the unpadded length of ``token_ids``,
    or of the first tensor key when there are no ``token_ids``).
    """
    if make_sequence_length_divisible_by < 1:
        raise ValueError(
            f"make_sequence_length_divisible_by must be >= 1, got {make_sequence_length_divisible_by}"
        )
    pad_value_dict = pad_value_dict or {}
    flats = [message_log_to_flat_messages(log) for log in message_log_batch]
    if not flats:
        return BatchedDataDict(), torch.zeros(0, dtype=torch.long)
    tensor_keys = [k for k, v in flats[0].items() if isinstance(v, torch.Tensor)]
    length_key = "token_ids" if "token_ids" in tensor_keys else (tensor_keys or [None])[0]
    input_lengths = torch.tensor(
        [len(flat[length_key]) if length_key else 0 for flat in flats], dtype=torch.long
    )
    batch: BatchedDataDict[FlatMessagesType] = BatchedDataDict()
    for key in flats[0]:
        values = [flat.get(key) for flat in flats]
        if key not in tensor_keys:
            batch[key] = values
            continue
        for i, value in enumerate(values):
            if not isinstance(value, torch.Tensor):
                raise ValueError(f"sample {i} has no tensor key {key!r} that sample 0 has")
        width = max(len(v) for v in values)
        width = -(-width // make_sequence_length_divisible_by) * make_sequence_length_divisible_by
        padded = torch.full((len(values), width), pad_value_dict.get(key, 0), dtype=values[0].dtype)
        for i, value in enumerate(values):
            padded[i, : len(value)] = value
        batch[key] = padded
    return batch, input_lengths


def add_loss_mask_to_message_log(
    batch_message_log: list[LLMMessageLogType],
    roles_to_train_on: list[str] | None = None,
    only_unmask_final: bool = False,
) -> None:
    """Give every turn a ``token_loss_mask``: ones on trained roles, zeros elsewhere (in place).

    ``only_unmask_final`` trains only on the last turn of each conversation (SFT of a
    final answer), whatever its role.
    """
    roles = set(roles_to_train_on if roles_to_train_on is not None else ["assistant"])
    for message_log in batch_message_log:
        for i, message in enumerate(message_log):
            train = (i == len(message_log) - 1) if only_unmask_final else message["role"] in roles
            ids = message["token_ids"]
            message["token_loss_mask"] = (
                torch.ones_like(ids, dtype=torch.bool)
                if train
                else torch.zeros_like(ids, dtype=torch.bool)
            )


def message_logs_to_train_data(
    message_logs: list[LLMMessageLogType],
    pad_token_id: int,
    make_sequence_length_divisible_by: int = 1,
) -> BatchedDataDict:
    """The flat training inputs of a rollout: ``input_ids``, ``input_lengths``, ``token_mask``,
    ``generation_logprobs``.

    Turns without ``generation_logprobs`` (prompts, environment answers) get zeros and turns
    without a ``token_loss_mask`` get the assistant-only mask, so callers need not prepare them.
    """
    for message_log in message_logs:
        for message in message_log:
            ids = message["token_ids"]
            if "generation_logprobs" not in message:
                message["generation_logprobs"] = torch.zeros(len(ids), dtype=torch.float32)
            if "token_loss_mask" not in message:
                is_assistant = message["role"] == "assistant"
                message["token_loss_mask"] = torch.full((len(ids),), is_assistant, dtype=torch.bool)
    flat, input_lengths = batched_message_log_to_flat_message(
        message_logs,
        pad_value_dict={"token_ids": pad_token_id},
        make_sequence_length_divisible_by=make_sequence_length_divisible_by,
    )
    return BatchedDataDict(
        {
            "input_ids": flat["token_ids"],
            "input_lengths": input_lengths,
            "token_mask": flat["token_loss_mask"].to(torch.float32),
            "generation_logprobs": flat["generation_logprobs"].to(torch.float32),
        }
    )


def get_formatted_message_log(
    message_log: LLMMessageLogType,
    tokenizer: Any,
    task_data_spec: TaskDataSpec | None = None,
    add_bos_token: bool = True,
    add_eos_token: bool = True,
    add_generation_prompt: bool = False,
) -> LLMMessageLogType:
    """Render each turn with the chat template and tokenize it, turn by turn.

    Each turn's ``content`` becomes its exact slice of the rendered conversation (the text
    between the rendering of the turns before it and the rendering including it), so the
    concatenated ``token_ids`` equal the tokenized conversation. The last turn carries the
    generation prompt when ``add_generation_prompt`` is set. A ``task_data_spec`` prompt is
    applied to user turns and its system prompt is prepended when the log has none.
    """
    from nemo_rl_core.data.chat_templates import render_chat

    messages = [dict(m) for m in message_log]
    if task_data_spec is not None:
        if task_data_spec.prompt:
            for message in messages:
                if message["role"] == "user":
                    message["content"] = task_data_spec.prompt.format(message["content"])
        if task_data_spec.system_prompt and (not messages or messages[0]["role"] != "system"):
            messages.insert(0, {"role": "system", "content": task_data_spec.system_prompt})
    formatted: LLMMessageLogType = []
    previous = ""
    for i, message in enumerate(messages):
        last = i == len(messages) - 1
        rendered = render_chat(
            tokenizer,
            [{"role": m["role"], "content": m["content"]} for m in messages[: i + 1]],
            add_generation_prompt=add_generation_prompt and last,
        )
        if not rendered.startswith(previous):
            raise ValueError(
                "the chat template renders earlier turns differently once a later turn is "
                f"added (turn {i}, role {message['role']!r}); per-turn token accounting needs a "
                "prefix-stable template"
            )
        content = rendered[len(previous) :]
        previous = rendered
        if (
            i == 0
            and add_bos_token
            and tokenizer.bos_token
            and not content.startswith(tokenizer.bos_token)
        ):
            content = tokenizer.bos_token + content
        needs_eos = last and add_eos_token and not add_generation_prompt and tokenizer.eos_token
        if needs_eos and not content.rstrip("\n").endswith(tokenizer.eos_token):
            content = content + tokenizer.eos_token
        token_ids = tokenizer(content, return_tensors="pt", add_special_tokens=False)["input_ids"][
            0
        ]
        formatted.append({**message, "content": content, "token_ids": token_ids})
    return formatted
