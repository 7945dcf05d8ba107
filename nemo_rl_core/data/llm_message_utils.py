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

import os
import warnings
from collections.abc import Sequence
from typing import Any, cast

import torch

from nemo_rl_core.data.chat_templates import render_chat
from nemo_rl_core.data.interfaces import FlatMessagesType, LLMMessageLogType, TaskDataSpec
from nemo_rl_core.data.multimodal_utils import PackedTensor
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict


def message_log_to_flat_messages(message_log: LLMMessageLogType) -> FlatMessagesType:
    """Concatenate the turns of one conversation key by key.

    Tensors are concatenated along their first (token) dimension, keeping any trailing
    dimensions (e.g. routed experts' ``[tokens, layers, top_k]``); ``PackedTensor`` values
    (images) are packed; other values (``role``, ``content``) become a list. A key only some
    turns have collects only those turns, as in NeMo RL (e.g. logprobs before they are
    filled in for the prompt).
    """
    collected: dict[str, list[Any]] = {}
    for message in message_log:
        for key, value in message.items():
            collected.setdefault(key, []).append(value)
    flat: FlatMessagesType = {}
    for key, values in collected.items():
        if isinstance(values[0], torch.Tensor):
            if len({value.dim() for value in values}) > 1:
                raise RuntimeError(
                    f"tensors for {key=} must have same number of dimensions: "
                    f"{[tuple(value.shape) for value in values]}"
                )
            flat[key] = torch.cat(values)
        elif isinstance(values[0], PackedTensor):
            flat[key] = PackedTensor.concat(values)
        else:
            flat[key] = values
    return flat


def get_keys_from_message_log(message_log: LLMMessageLogType, keys: list[str]) -> LLMMessageLogType:
    """The same turns, keeping only ``keys`` (e.g. ``["role", "content"]`` for an API call)."""
    return [{key: message[key] for key in keys if key in message} for message in message_log]


def _validate_tensor_consistency(tensors: list[torch.Tensor], key: str = "") -> None:
    """One dtype, one device and one shape past the token dimension, or a RuntimeError."""
    if not tensors:
        return
    where = f" for {key=}" if key else ""
    if len({t.dtype for t in tensors}) > 1:
        raise RuntimeError(
            f"expected consistent types{where} but got: {[t.dtype for t in tensors]}"
        )
    if len({t.device for t in tensors}) > 1:
        raise RuntimeError(
            f"expected tensors on the same device{where} but got: {[t.device for t in tensors]}"
        )
    if len({t.shape[1:] for t in tensors}) > 1:
        raise RuntimeError(
            f"expected the same shape after the token dimension{where} but got: "
            f"{[tuple(t.shape) for t in tensors]}"
        )


def batched_message_log_to_flat_message(
    message_log_batch: list[LLMMessageLogType],
    pad_value_dict: dict[str, int | float] | None = None,
    make_sequence_length_divisible_by: int = 1,
) -> tuple[BatchedDataDict[FlatMessagesType], torch.Tensor]:
    """Flatten every conversation and right-pad every tensor key to one width.

    The width is the longest tensor of the batch, rounded up to a multiple of
    ``make_sequence_length_divisible_by``; each key pads with ``pad_value_dict[key]``
    (default 0) and keeps its trailing dimensions (``[B, S, ...]``). A conversation
    without a key gets only padding there. ``PackedTensor`` keys hold one packed tensor
    per conversation. Returns the batch and ``input_lengths`` (int32 ``[B]``: each
    conversation's longest tensor before padding). Tensors of one key must share dtype
    and device (``RuntimeError`` otherwise). Without any tensor, each key holds its first
    value per conversation and ``input_lengths`` is empty.
    """
    if make_sequence_length_divisible_by < 1:
        raise ValueError(
            f"make_sequence_length_divisible_by must be >= 1, got {make_sequence_length_divisible_by}"
        )
    no_lengths = torch.empty(0, dtype=torch.int32)
    if not message_log_batch:
        return BatchedDataDict(), no_lengths
    flats = [message_log_to_flat_messages(log) for log in message_log_batch]
    keys = list(dict.fromkeys(key for flat in flats for key in flat))
    lengths = [
        max((v.size(0) for v in flat.values() if isinstance(v, torch.Tensor)), default=None)
        for flat in flats
    ]
    if all(length is None for length in lengths):
        # No token tensor in any log: each value is the list of a key's strings.
        no_tensors = {
            k: [cast(list[str], f[k])[0] if k in f else None for f in flats] for k in keys
        }
        return BatchedDataDict(no_tensors), no_lengths
    width = max(length or 0 for length in lengths)
    width = -(-width // make_sequence_length_divisible_by) * make_sequence_length_divisible_by
    batch: BatchedDataDict[FlatMessagesType] = BatchedDataDict()
    for key in keys:
        values = [flat.get(key) for flat in flats]
        present = [v for v in values if v is not None]
        # One key holds one kind of value in every message log; its first says which.
        if isinstance(present[0], PackedTensor):
            dim = present[0].dim_to_pack
            packs = cast(list[PackedTensor | None], values)
            batch[key] = PackedTensor.flattened_concat(
                [v if v is not None else PackedTensor([None], dim) for v in packs]
            )
        elif isinstance(present[0], torch.Tensor):
            tensors = cast(list[torch.Tensor | None], values)
            _validate_tensor_consistency(cast(list[torch.Tensor], present), key)
            ref = present[0]
            pad = (pad_value_dict or {}).get(key, 0)
            padded = torch.full(
                (len(values), width, *ref.shape[1:]), pad, dtype=ref.dtype, device=ref.device
            )
            for row, value in enumerate(tensors):
                if value is not None:
                    padded[row, : value.size(0)] = value
            batch[key] = padded
        else:
            batch[key] = values
    input_lengths = torch.tensor([length or 0 for length in lengths], dtype=torch.int32)
    return batch, input_lengths


def add_loss_mask_to_message_log(
    batch_message_log: list[LLMMessageLogType],
    roles_to_train_on: Sequence[str] = ("assistant",),
    only_unmask_final: bool = False,
) -> None:
    """Give every turn a ``token_loss_mask`` (in place): ones on the turns of
    ``roles_to_train_on`` (case-insensitive), zeros elsewhere, in the dtype of its
    ``token_ids``. ``only_unmask_final`` trains only on each conversation's last turn,
    whatever its role (SFT of a final answer)."""
    roles = {role.lower() for role in roles_to_train_on}
    for message_log in batch_message_log:
        for i, message in enumerate(message_log):
            train = (i == len(message_log) - 1) if only_unmask_final else message["role"] in roles
            ids = message["token_ids"]
            message["token_loss_mask"] = torch.ones_like(ids) if train else torch.zeros_like(ids)


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
                message["token_loss_mask"] = torch.full_like(ids, int(is_assistant))
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


def get_first_index_that_differs(str1: str, str2: str) -> int:
    """Where two strings first differ (the shorter one's length if one is a prefix)."""
    return len(os.path.commonprefix([str1, str2]))


def get_formatted_message_log(
    message_log: LLMMessageLogType,
    tokenizer: Any,
    task_data_spec: TaskDataSpec | None = None,
    add_bos_token: bool = True,
    add_eos_token: bool = True,
    add_generation_prompt: bool = False,
    tools: list[dict[str, Any]] | None = None,
    debug: bool = False,
) -> LLMMessageLogType:
    """Render the conversation with the chat template turn by turn and tokenize each turn.

    Turn i's ``content`` becomes the text the template adds for it: the rendering of turns
    0..i from the first character where it differs from the rendering of turns 0..i-1
    (templates that re-render earlier turns, e.g. dropping old ``<think>`` blocks, still
    split). With ``add_generation_prompt`` each user or tool turn carries the assistant's
    generation prompt, so a following assistant turn holds only its own text. The
    ``task_data_spec`` prompt formats the first user turn (system prompts are the
    processors' business). ``add_bos_token`` / ``add_eos_token`` add BOS to the first turn
    and EOS to the last when the template did not (EOS followed by newlines counts).
    ``tools`` go to the template; ``debug`` prints each turn's text.
    """
    messages = [dict(message) for message in message_log]
    for message in messages:
        _check_text_only(message.get("content"))
    first_user = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if task_data_spec is not None and task_data_spec.prompt and first_user is not None:
        content = messages[first_user]["content"]
        messages[first_user]["content"] = (
            task_data_spec.prompt.format(content)
            if isinstance(content, str)
            else [{**part, "text": task_data_spec.prompt.format(part["text"])} for part in content]
        )
    formatted: LLMMessageLogType = []
    previous = ""
    if debug:
        print("DEBUG: Individual message turns from apply_chat_template")
    for i, message in enumerate(messages):
        rendered = render_chat(
            tokenizer,
            messages[: i + 1],
            add_generation_prompt=add_generation_prompt and message["role"] in ("user", "tool"),
            tools=tools,
        )
        chunk = rendered[get_first_index_that_differs(previous, rendered) :]
        previous = rendered
        if i == 0 and add_bos_token:
            chunk = _with_special_token(chunk, tokenizer.bos_token, "add_bos_token", at_end=False)
        if i == len(messages) - 1 and add_eos_token:
            chunk = _with_special_token(chunk, tokenizer.eos_token, "add_eos_token", at_end=True)
        token_ids = tokenizer(chunk, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
        formatted.append(
            {
                **message,
                "content": _content_with_text(message.get("content"), chunk),
                "token_ids": token_ids.to(torch.int64),  # an empty turn tokenizes to float
            }
        )
        if debug:
            print(f"[turn {i + 1}/{len(messages)}] role={message['role']}: {chunk!r}")
    if debug:
        print(f"DEBUG: Complete formatted conversation:\n{previous}")
    return formatted


def _check_text_only(content: Any) -> None:
    for part in content if isinstance(content, list) else []:
        if part.get("type") != "text":
            raise ValueError(
                f"a message has a {part.get('type')!r} content part: images, audio and video "
                "need a multimodal processor, which this deployment does not have"
            )


def _content_with_text(content: Any, text: str) -> Any:
    """``text`` in the shape of ``content``: a string, or each part of a list of text parts."""
    if isinstance(content, list) and content:
        return [{**part, "text": text} for part in content]
    return text


def _with_special_token(chunk: str, token: str | None, flag: str, at_end: bool) -> str:
    if token is None:
        warnings.warn(
            f"{flag} is set but the tokenizer has no such token; none added", stacklevel=3
        )
        return chunk
    if at_end:
        return chunk if chunk.rstrip("\n").endswith(token) else chunk + token
    return chunk if chunk.startswith(token) else token + chunk
