"""Row -> ``DatumSpec`` processors (NeMo RL's ``nemo_rl.data.processors``).

Each processor renders the prompt with the chat template (``get_formatted_message_log``),
tokenizes it turn by turn and caps it at ``max_seq_length``: a prompt that does not fit is
cut and gets ``loss_multiplier`` 0, so it is generated on but never trained on, as in
NeMo RL. Rows are the normalized form the datasets produce: ``problem`` and
``expected_answer`` (math, countdown), ``game_state`` (sliding puzzle), or NeMo RL's chat
rows (``messages``: question, answer) for ``math_hf_data_processor``. ``sft_processor``
makes a conversation to train on instead of a prompt, ``preference_preprocessor`` a chosen
and a rejected conversation (DPO, reward models).
"""

from typing import Any

from nemo_rl_core.data.interfaces import (
    DatumSpec,
    LLMMessageLogType,
    PreferenceDatumSpec,
    TaskDataProcessFnCallable,
    TaskDataSpec,
)


def math_data_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A question with a checkable answer; the environment gets ``ground_truth``."""
    extra_env_info: dict[str, Any] = {"ground_truth": str(datum_dict["expected_answer"])}
    if "numbers" in datum_dict:  # countdown rows: the answer must use these numbers
        extra_env_info["numbers"] = list(datum_dict["numbers"])
    return _datum(
        [{"role": "user", "content": str(datum_dict["problem"])}],
        task_data_spec,
        tokenizer,
        max_seq_length,
        idx,
        extra_env_info,
        task_name=datum_dict.get("task_name") or task_data_spec.task_name or "math",
    )


def sliding_puzzle_data_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """The opening board of a game; its state rides in ``extra_env_info`` for the env."""
    from nemo_rl_core.environments.games.sliding_puzzle import (
        ACTION_STOP_STRINGS,
        SlidingPuzzleGameLogic,
    )

    state = datum_dict["game_state"]
    datum = _datum(
        [{"role": "user", "content": SlidingPuzzleGameLogic.init(state)}],
        task_data_spec,
        tokenizer,
        max_seq_length,
        idx,
        {"game_state": state, "num_moves": 0, "max_moves": int(datum_dict["max_moves"])},
        task_name=task_data_spec.task_name or "sliding_puzzle_game",
    )
    datum["stop_strings"] = list(ACTION_STOP_STRINGS)
    return datum


def math_hf_data_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A chat row (``messages``: the question, then the reference answer) as one user turn.

    NeMo RL's processor for OpenMathInstruct2-style rows: the system prompt and the
    prompt-formatted question are rendered together with the generation prompt into a
    single user turn; the second message's content is the ``ground_truth``.
    """
    messages = datum_dict["messages"]
    if len(messages) < 2:
        raise ValueError(
            f"row {idx}: 'messages' needs the question and the reference answer, "
            f"got {len(messages)} message(s)"
        )
    question = messages[0]["content"]
    if task_data_spec.prompt:
        question = task_data_spec.prompt.format(question)
    chat = _with_system_prompt([{"role": "user", "content": question}], task_data_spec)
    text = tokenizer.apply_chat_template(
        chat, tokenize=False, add_generation_prompt=True, add_special_tokens=False
    )
    token_ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0]
    return _capped_datum(
        [{"role": "user", "content": text, "token_ids": token_ids}],
        tokenizer,
        max_seq_length,
        idx,
        {"ground_truth": messages[1]["content"]},
        task_name=datum_dict["task_name"],
    )


def sft_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
    add_bos: bool = True,
    add_eos: bool = True,
    add_generation_prompt: bool = False,
) -> DatumSpec:
    """NeMo RL's SFT datum: the row's conversation (``messages``, or ResponseDataset's prompt
    and response as a user and an assistant turn) under the chat template, each turn
    tokenized (which turns are trained on is decided later, by role). The prompt file
    formats the first user turn; the system prompt file leads unless the row has its own."""
    messages = datum_dict.get("messages") or [
        {"role": "user", "content": str(datum_dict["problem"])},
        {"role": "assistant", "content": str(datum_dict["expected_answer"])},
    ]
    from nemo_rl_core.data.llm_message_utils import get_formatted_message_log  # loads torch

    message_log = get_formatted_message_log(
        _with_system_prompt(messages, task_data_spec),
        tokenizer,
        task_data_spec,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        add_generation_prompt=add_generation_prompt,
        tools=datum_dict.get("tools"),
    )
    return _capped_datum(
        message_log,
        tokenizer,
        max_seq_length,
        idx,
        {},
        task_name=datum_dict.get("task_name") or task_data_spec.task_name or "sft",
    )


def preference_preprocessor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
) -> PreferenceDatumSpec:
    """NeMo RL's preference datum: the ``context`` followed by the lower-ranked (preferred)
    completion, and by the other, each under the chat template. A pair longer than
    ``max_seq_length`` on either side is cut to a few tokens per turn and gets
    ``loss_multiplier`` 0, as NeMo RL does, so batches keep their shape."""
    from nemo_rl_core.data.llm_message_utils import get_formatted_message_log  # loads torch

    first, second = datum_dict["completions"]
    chosen, rejected = (first, second) if first["rank"] < second["rank"] else (second, first)
    logs = [
        get_formatted_message_log(
            _with_system_prompt(
                [*datum_dict["context"], *completion["completion"]], task_data_spec
            ),
            tokenizer,
            task_data_spec,
            add_bos_token=tokenizer.bos_token is not None,
        )
        for completion in (chosen, rejected)
    ]
    lengths = [sum(len(m["token_ids"]) for m in log) for log in logs]
    loss_multiplier = 1.0
    if max(lengths) > max_seq_length:
        for log in logs:
            share = max(min(4, max_seq_length // len(log)), 1)
            for message in log:
                message["token_ids"] = message["token_ids"][:share]
                message["content"] = tokenizer.decode(message["token_ids"])
        lengths = [sum(len(m["token_ids"]) for m in log) for log in logs]
        loss_multiplier = 0.0
    return PreferenceDatumSpec(
        message_log_chosen=logs[0],
        message_log_rejected=logs[1],
        length_chosen=lengths[0],
        length_rejected=lengths[1],
        loss_multiplier=loss_multiplier,
        idx=idx,
        task_name=datum_dict.get("task_name") or task_data_spec.task_name or "preference",
    )


def _with_system_prompt(
    messages: LLMMessageLogType, task_data_spec: TaskDataSpec
) -> LLMMessageLogType:
    """``messages`` after the task's system prompt, unless they start with their own."""
    if not task_data_spec.system_prompt or (messages and messages[0]["role"] == "system"):
        return messages
    return [{"role": "system", "content": task_data_spec.system_prompt}, *messages]


def _datum(
    messages: LLMMessageLogType,
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
    extra_env_info: dict[str, Any],
    task_name: str,
) -> DatumSpec:
    # Imported here: it loads torch, and the config check reads the processors' names
    # and prompt files without it.
    from nemo_rl_core.data.llm_message_utils import get_formatted_message_log

    message_log = get_formatted_message_log(
        _with_system_prompt(messages, task_data_spec),
        tokenizer,
        task_data_spec,
        add_bos_token=tokenizer.bos_token is not None,
        add_eos_token=False,
        add_generation_prompt=True,
    )
    return _capped_datum(message_log, tokenizer, max_seq_length, idx, extra_env_info, task_name)


def _capped_datum(
    message_log: LLMMessageLogType,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
    extra_env_info: dict[str, Any],
    task_name: str,
) -> DatumSpec:
    """A sequence of ``max_seq_length`` tokens or more (a prompt that leaves no room to
    generate, a conversation too long to train on) is cut and gets ``loss_multiplier`` 0:
    never trained on, as in NeMo RL."""
    length = sum(len(m["token_ids"]) for m in message_log)
    loss_multiplier = 1.0
    if length >= max_seq_length:
        # Keep an equal share of every turn so the system prompt and question both survive.
        share = max(max_seq_length // len(message_log), 1)
        for message in message_log:
            message["token_ids"] = message["token_ids"][:share]
            message["content"] = tokenizer.decode(message["token_ids"])
        length = sum(len(m["token_ids"]) for m in message_log)
        loss_multiplier = 0.0
    return DatumSpec(
        message_log=message_log,
        length=length,
        extra_env_info=extra_env_info,
        loss_multiplier=loss_multiplier,
        idx=idx,
        task_name=task_name,
    )


# NeMo RL's processors by the names a dataset's ``processor`` key takes; ``default`` is what
# a ``ResponseDataset`` row (``messages``: question, answer) is processed with.
PROCESSOR_REGISTRY: dict[str, TaskDataProcessFnCallable] = {
    "default": math_hf_data_processor,
    "math_data_processor": math_data_processor,
    "math_hf_data_processor": math_hf_data_processor,
    "sliding_puzzle_data_processor": sliding_puzzle_data_processor,
    "sft_processor": sft_processor,
    "preference_preprocessor": preference_preprocessor,
}


def register_processor(processor_name: str, processor_function: TaskDataProcessFnCallable) -> None:
    """Add a processor a dataset's ``processor`` key can name; a taken name is refused."""
    if processor_name in PROCESSOR_REGISTRY:
        raise ValueError(f"Processor name {processor_name} already registered")
    PROCESSOR_REGISTRY[processor_name] = processor_function
