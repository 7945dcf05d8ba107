"""Row -> ``DatumSpec`` processors (NeMo RL's ``nemo_rl.data.processors``).

Each processor renders the prompt with the chat template (``get_formatted_message_log``),
tokenizes it turn by turn and caps it at ``max_seq_length``: a prompt that does not fit is
cut and gets ``loss_multiplier`` 0, so it is generated on but never trained on, as in
NeMo RL. Rows are the normalized form the datasets produce: ``problem`` and
``expected_answer`` (math, countdown) or ``game_state`` (sliding puzzle).
"""

from typing import Any

from nemo_rl_core.data.interfaces import DatumSpec, LLMMessageLogType, TaskDataSpec
from nemo_rl_core.data.llm_message_utils import get_formatted_message_log


def math_data_processor(
    datum_dict: dict[str, Any],
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
) -> DatumSpec:
    """A question with a checkable answer; the environment gets ``ground_truth``."""
    extra_env_info = {"ground_truth": str(datum_dict["expected_answer"])}
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


def _datum(
    messages: LLMMessageLogType,
    task_data_spec: TaskDataSpec,
    tokenizer: Any,
    max_seq_length: int,
    idx: int,
    extra_env_info: dict[str, Any],
    task_name: str,
) -> DatumSpec:
    message_log = get_formatted_message_log(
        messages,
        tokenizer,
        task_data_spec,
        add_bos_token=True,
        add_eos_token=False,
        add_generation_prompt=True,
    )
    length = sum(len(m["token_ids"]) for m in message_log)
    loss_multiplier = 1.0
    if length > max_seq_length:
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
