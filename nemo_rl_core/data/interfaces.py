"""Per-sample data types of NeMo RL (``nemo_rl.data.interfaces``).

A message log is a list of chat turns; each turn carries its text and, once
tokenized, its ``token_ids`` (and after generation ``generation_logprobs``), so the
token accounting of a multi-turn episode is exact per turn.
"""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NotRequired, Protocol, TypedDict

if TYPE_CHECKING:  # the config check reads TaskDataSpec without loading torch
    import torch

    from nemo_rl_core.data.multimodal_utils import PackedTensor

LLMMessageLogType = list[dict[str, Any]]
# The max_seq_length processors get where none is set (data.max_input_seq_length: null).
UNCAPPED_LENGTH = 2**31 - 1
# The seed says list[str] | Tensor; its own flattening also stores multimodal PackedTensors.
FlatMessagesType = dict[str, "list[str] | torch.Tensor | PackedTensor"]


class DatumSpec(TypedDict):
    message_log: LLMMessageLogType
    length: int  # total length of the token_ids of all messages
    extra_env_info: dict[str, Any]
    loss_multiplier: float  # 0.0 drops the sample from the loss
    idx: int
    task_name: NotRequired[str]
    stop_strings: NotRequired[list[str]]
    __extra__: NotRequired[Any]


class PreferenceDatumSpec(TypedDict):
    """One preference row (NeMo RL's): the context followed by the chosen completion, and
    by the rejected one, each a tokenized message log."""

    message_log_chosen: LLMMessageLogType
    message_log_rejected: LLMMessageLogType
    length_chosen: int
    length_rejected: int
    loss_multiplier: float  # 0.0: the pair does not fit max_seq_length and is not trained on
    idx: int
    task_name: NotRequired[str]


@dataclass
class TaskDataSpec:
    """How one task's rows become prompts: its name, prompt template and system prompt.

    ``prompt_file`` holds a format string with one ``{}`` for the row's question;
    ``system_prompt_file`` the system prompt. Both are read once, here, so a missing file
    fails at setup with its path.
    """

    task_name: str | None = None
    prompt_file: str | os.PathLike | None = None
    system_prompt_file: str | os.PathLike | None = None
    prompt: str | None = field(default=None, init=False)
    system_prompt: str | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.prompt = _read_prompt_file(self.prompt_file, "prompt_file")
        self.system_prompt = _read_prompt_file(self.system_prompt_file, "system_prompt_file")
        if self.prompt is not None and "{}" not in self.prompt:
            raise ValueError(
                f"prompt_file {self.prompt_file} has no '{{}}' placeholder for the question"
            )

    def copy_defaults(self, from_spec: "TaskDataSpec") -> None:
        """Fill the fields left unset here from ``from_spec`` (a task falls back to the default)."""
        for name in ("prompt_file", "system_prompt_file", "prompt", "system_prompt"):
            if getattr(self, name) is None:
                setattr(self, name, getattr(from_spec, name))


def _read_prompt_file(path: str | os.PathLike | None, key: str) -> str | None:
    if path is None:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"data.{key}: {path} does not exist")
    return Path(path).read_text()


class TaskDataProcessFnCallable(Protocol):
    """Turns one dataset row into a ``DatumSpec`` (tokenized, templated, length-capped), or
    a preference row into a ``PreferenceDatumSpec``."""

    def __call__(
        self,
        datum_dict: dict[str, Any],
        task_data_spec: TaskDataSpec,
        tokenizer: Any,
        max_seq_length: int,
        idx: int,
    ) -> DatumSpec | PreferenceDatumSpec: ...


class TaskDataPreProcessFnCallable(Protocol):
    """Reshapes one raw row before its task's processor reads it (a dataset whose rows
    need a fix-up the shared processor does not know about)."""

    def __call__(self, datum_dict: dict[str, Any]) -> dict[str, Any]: ...
