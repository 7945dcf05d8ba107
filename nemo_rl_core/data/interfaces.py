"""Per-sample data types of NeMo RL (``nemo_rl.data.interfaces``).

A message log is a list of chat turns; each turn carries its text and, once
tokenized, its ``token_ids`` (and after generation ``generation_logprobs``), so the
token accounting of a multi-turn episode is exact per turn.
"""

from typing import Any, NotRequired, TypedDict

import torch

LLMMessageLogType = list[dict[str, Any]]
FlatMessagesType = dict[str, list[str] | torch.Tensor]


class DatumSpec(TypedDict):
    message_log: LLMMessageLogType
    length: int  # total length of the token_ids of all messages
    extra_env_info: dict[str, Any]
    loss_multiplier: float  # 0.0 drops the sample from the loss
    idx: int
    task_name: NotRequired[str]
    stop_strings: NotRequired[list[str]]
    __extra__: NotRequired[Any]
