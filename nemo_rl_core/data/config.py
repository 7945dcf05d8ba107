"""The ``data:`` section of a run config with NeMo RL v0.7's keys, validated once at setup.

NeMo RL v0.7 names its datasets per split: ``data.train`` and ``data.validation`` (one
dataset or a list), each merged over ``data.default``. A dataset is a built-in generator
here (``arithmetic``, ``addition``, ``countdown``, ``sliding_puzzle``; ``addition_sft``: the
additions as SFT conversations; ``addition_preference``: as preference pairs;
``addition_answer_line`` and ``addition_answer_line_sft``: the additions asking for a last line
"Answer: <number>", DAPO's format), ``ResponseDataset``
(rows from a local JSONL/Parquet file or ``save_to_disk`` folder at ``data_path``),
``PreferenceDataset`` / ``BinaryPreferenceDataset`` (preference rows from such a file, for
DPO and reward models), ``openai_format`` (SFT conversations in the OpenAI chat format, with
their tools), or one of NeMo RL's
hub datasets: those validate, so NeMo RL's configs load, and are refused before any work
on a deployment that cannot download (every deployment of this project).
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import Check, Only, PartOf, ReadWhile, SupportContext, Wired

BUILTIN_DATASETS = (
    "arithmetic",
    "addition",
    "addition_sft",
    "addition_answer_line",
    "addition_answer_line_sft",
    "addition_preference",
    "countdown",
    "sliding_puzzle",
)
LOCAL_DATASET = "ResponseDataset"  # NeMo RL's name for "rows from my own files"
# NeMo RL's preference rows from local files: its own format, and prompt/chosen/rejected.
PREFERENCE_DATASET = "PreferenceDataset"
BINARY_PREFERENCE_DATASET = "BinaryPreferenceDataset"
# NeMo RL's SFT conversations in the OpenAI chat format (with tools), from a local file.
OPENAI_DATASET = "openai_format"
OPENAI_KEYS = ("chat_key", "system_key", "system_prompt", "tool_key", "use_preserving_dataset")
LOCAL_DATASETS = (LOCAL_DATASET, PREFERENCE_DATASET, BINARY_PREFERENCE_DATASET, OPENAI_DATASET)
# NeMo RL v0.7's registry of response datasets that it downloads from the Hugging Face hub.
HUB_DATASETS = (
    "AIME2024",
    "AIME2025",
    "AIME2026",
    "DAPOMath17K",
    "DAPOMathAIME2024",
    "DeepScaler",
    "GSM8K",
    "gsm8k",
    "HelpSteer3",
    "Nemotron-Cascade-2-SFT-Math",
    "OpenMathInstruct-2",
    "open_assistant",
    "squad",
    "tulu3_sft_mixture",
    "Tulu3Preference",
)
# The rest of NeMo RL v0.7's dataset registry: they validate, so its configs load, and are
# refused before any work, each with why.
_TEXT_ONLY = "this project trains text-only models"
_MULTIMODAL = f"a vision or audio dataset, and {_TEXT_ONLY}"
NOT_BUILT_DATASETS = {
    **dict.fromkeys(
        (
            "audiomcq",
            "avqa",
            "clevr-cogent",
            "daily-omni",
            "geometry3k",
            "mmpr-tiny",
            "refcoco",
        ),
        _MULTIMODAL,
    ),
    "NemoGymDataset": "NeMo Gym's dataset for its environments, which are not built here",
    "arrow_text": f"NeMo RL's Arrow text loader is not built here; use {LOCAL_DATASET}",
    "general-conversation-jsonl": (
        f"NeMo RL's conversation JSONL loader is not built here; use {LOCAL_DATASET}"
    ),
}
PROCESSORS = (
    "default",
    "math_data_processor",
    "math_hf_data_processor",
    "sliding_puzzle_data_processor",
    "sft_processor",
    "preference_preprocessor",
)
# The rest of NeMo RL v0.7's processor registry: they validate and are refused, with why.
NOT_BUILT_PROCESSORS = {
    "vlm_hf_data_processor": f"NeMo RL's processor of vision and audio samples, and {_TEXT_ONLY}",
    "nemo_gym_data_processor": NOT_BUILT_DATASETS["NemoGymDataset"],
    "kd_data_processor": "NeMo RL's off-policy distillation processor, not built here",
    "multichoice_qa_processor": "NeMo RL's multiple-choice processor, not built here",
}
SFT_PROCESSOR = "sft_processor"  # NeMo RL's: a conversation to train on, not a prompt
# datasets whose rows are conversations to train on, not prompts
SFT_DATASETS = ("addition_sft", "addition_answer_line_sft", OPENAI_DATASET)
# NeMo RL's: a chosen and a rejected conversation (DPO, reward models)
PREFERENCE_PROCESSOR = "preference_preprocessor"

_BUILDER = "nemo_rl_core.data.datasets.builder"
_OLD_LAYOUT = (
    "NeMo RL's pre-v0.5 data layout: v0.7 (and this project) reads nothing here, so it would "
    "not pick the dataset or prompt it names; set data.train.* or data.default.* instead"
)


def is_class_path(name: str | None) -> bool:
    """A ``dataset_name`` naming a user's dataset class by import path
    (``my_pkg.datasets.MyDataset``), which NeMo RL imports in place of a registered name."""
    return name is not None and "." in name and name not in NOT_BUILT_DATASETS


def unavailable_reason(name: str | None) -> str | None:
    """Why NeMo RL's dataset ``name`` does not load here (a hub, multimodal or Gym
    dataset), or None where it does."""
    if name in HUB_DATASETS:
        return (
            "a Hugging Face hub dataset, and this deployment downloads nothing; use "
            f"{LOCAL_DATASET} with data_path (JSONL, Parquet or a save_to_disk folder) or a "
            f"built-in generator ({', '.join(BUILTIN_DATASETS)})"
        )
    return NOT_BUILT_DATASETS.get(name or "")


def _loadable_here(name: str | None, context: SupportContext) -> str | None:
    return unavailable_reason(name)


def _processor_here(name: str | None, context: SupportContext) -> str | None:
    return NOT_BUILT_PROCESSORS.get(name or "")


def _capped_here(cap: int | None, context: SupportContext) -> str | None:
    name = context.value(f"{context.key.rpartition('.')[0]}.dataset_name")
    if cap is None or name in LOCAL_DATASETS or is_class_path(name):
        return None
    return (
        f"NeMo RL caps the rows of its hub datasets with it, and {name!r} is not one that loads "
        "here; num_samples sets how many rows a built-in generator draws"
    )


def _read_by_the_run(section: Any, context: SupportContext) -> bool:
    """A dataset is read unless the run's games come from the sliding puzzle's environment,
    or it is one of ``data.validation`` that a preference run's ``val_data_paths`` replaces."""
    data = context.value("data")
    if context.key.startswith("data.validation.") and not data.datasets("validation"):
        return False
    return not games_from_environment(data, context.value("env") or {})


class DatasetConfig(BaseModel):
    """One dataset of a split: NeMo RL's ``ResponseDatasetConfig`` keys, ``repeat`` (each row
    that many times, as NeMo RL's AIME datasets take it), plus ``num_samples`` (how many rows
    a built-in generator draws). No rule of its keys applies where the run never reads it
    (a puzzle run's games come from its environment)."""

    model_config = ConfigDict(extra="forbid")
    read_while: ClassVar[ReadWhile] = ReadWhile(_read_by_the_run, still_read=())

    dataset_name: Annotated[
        str | None,
        Check(
            _loadable_here,
            "built-ins and ResponseDataset; NeMo RL's hub, multimodal and Gym names refused",
        ),
    ] = None
    data_path: Annotated[str | None, Wired(f"{_BUILDER}:load_rows")] = None
    input_key: Annotated[str, Wired(f"{_BUILDER}:load_rows")] = "input"
    output_key: Annotated[str, Wired(f"{_BUILDER}:load_rows")] = "output"
    subset: Annotated[
        str | None, Only(None, reason="a hub dataset's subset; nothing is downloaded here")
    ] = None
    split: Annotated[str | None, Wired(f"{_BUILDER}:load_rows")] = None
    prompt_file: Annotated[str | None, Wired(f"{_BUILDER}:build_dataset")] = None
    system_prompt_file: Annotated[str | None, Wired(f"{_BUILDER}:build_dataset")] = None
    env_name: Annotated[str | None, Wired(f"{_BUILDER}:build_dataset")] = None
    processor: Annotated[
        str | None, Check(_processor_here, "built here (build_dataset); NeMo RL's others refused")
    ] = None
    download_dir: Annotated[
        str | None, Only(None, reason="where hub downloads go; nothing is downloaded here")
    ] = None
    # Below 1: the share of rows held out for validation; 1 or more: that many rows (NeMo
    # RL's train_test_split takes a fraction or a count).
    split_validation_size: Annotated[float, Wired(f"{_BUILDER}:load_rows")] = Field(0.0, ge=0.0)
    seed: Annotated[int, Wired(f"{_BUILDER}:load_rows")] = 42
    num_samples: Annotated[int | None, Wired(f"{_BUILDER}:load_rows")] = Field(None, ge=1)
    repeat: Annotated[int, Wired(f"{_BUILDER}:load_rows")] = Field(1, ge=1)
    # A cap on the rows of NeMo RL's hub datasets that take it (Nemotron-Cascade-2-SFT-Math,
    # AVQA, AudioMCQ); its local datasets take it as an extra keyword and ignore it.
    max_samples: Annotated[
        int | None, Check(_capped_here, "null, or on a local dataset (which ignores it)")
    ] = Field(None, ge=1)
    # BinaryPreferenceDataset's columns (NeMo RL's PreferenceDatasetConfig); null: its
    # defaults "prompt", "chosen", "rejected".
    prompt_key: Annotated[str | None, Wired(f"{_BUILDER}:load_rows")] = None
    chosen_key: Annotated[str | None, Wired(f"{_BUILDER}:load_rows")] = None
    rejected_key: Annotated[str | None, Wired(f"{_BUILDER}:load_rows")] = None
    # openai_format's keys (NeMo RL's OpenAIFormatDataset): where a row keeps its
    # conversation and tools, and the system prompt put before it.
    chat_key: Annotated[str, Wired(f"{_BUILDER}:dataset_rows")] = "messages"
    system_key: Annotated[str | None, Wired(f"{_BUILDER}:dataset_rows")] = None
    system_prompt: Annotated[str | None, Wired(f"{_BUILDER}:dataset_rows")] = None
    tool_key: Annotated[str | None, Wired(f"{_BUILDER}:dataset_rows")] = "tools"
    use_preserving_dataset: Annotated[
        bool,
        Check(
            lambda value, context: None,
            "NeMo RL's guard against Hugging Face filling missing tool arguments with nulls; "
            "rows here are kept as written either way",
        ),
    ] = False

    @model_validator(mode="after")
    def _known_dataset(self) -> "DatasetConfig":
        name = self.dataset_name
        known = (*BUILTIN_DATASETS, *HUB_DATASETS, *NOT_BUILT_DATASETS, *LOCAL_DATASETS)
        if name in LOCAL_DATASETS and not self.data_path:
            raise ValueError(f"data_path is required when dataset_name is {name!r}")
        if name is not None and name not in known and not is_class_path(name):
            raise ValueError(
                f"dataset_name {name!r} is unknown; use one of {', '.join(BUILTIN_DATASETS)}, "
                f"one of {LOCAL_DATASETS} with data_path, a NeMo RL hub dataset name, or the "
                "import path of your own dataset class (my_pkg.datasets.MyDataset)"
            )
        binary_keys = ("prompt_key", "chosen_key", "rejected_key")
        set_keys = [key for key in binary_keys if getattr(self, key) is not None]
        if set_keys and name != BINARY_PREFERENCE_DATASET:
            raise ValueError(
                f"{set_keys[0]} names a column of {BINARY_PREFERENCE_DATASET!r} rows; "
                f"dataset {name!r} does not read it"
            )
        fields = type(self).model_fields
        openai_keys = [key for key in OPENAI_KEYS if getattr(self, key) != fields[key].default]
        if openai_keys and name != OPENAI_DATASET:
            raise ValueError(
                f"{openai_keys[0]} is a key of {OPENAI_DATASET!r} datasets; dataset {name!r} "
                "does not read it"
            )
        processors = (*PROCESSORS, *NOT_BUILT_PROCESSORS)
        if self.processor is not None and self.processor not in processors:
            raise ValueError(f"processor {self.processor!r} is unknown; use one of {PROCESSORS}")
        return self


DatasetsConfig = list[DatasetConfig]  # one dataset (a mapping in YAML) or a list of them
INPUT_FILE_KEYS = ("data_path", "prompt_file", "system_prompt_file")


def input_file(written: str | None, config_dir: Path) -> str | None:
    """A relative input file from the config file's directory (as ``defaults:`` resolve), or
    from the working directory where only that holds it (NeMo RL's own configs name files
    from its repository root); as written when neither does, so an error shows it so."""
    if written is None or Path(written).expanduser().is_absolute():
        return written
    for candidate in (config_dir / written, Path.cwd() / written):
        if candidate.exists():
            return str(candidate.resolve())
    return written


def _as_dict(entry: Any) -> dict[str, Any]:
    if isinstance(entry, BaseModel):
        return entry.model_dump(exclude_unset=True)
    return dict(entry) if isinstance(entry, dict) else entry


class DataConfig(BaseModel):
    """NeMo RL v0.7's ``data:``: loader settings and the datasets of each split."""

    model_config = ConfigDict(extra="forbid")

    max_input_seq_length: Annotated[int | None, Wired(f"{_BUILDER}:build_dataset")] = Field(
        None, ge=1
    )
    add_system_prompt: Annotated[
        bool | None,
        Only(
            None,
            False,
            reason="asks the chat template for its default system prompt; prompts here carry "
            "only data.*.system_prompt_file",
        ),
    ] = None
    shuffle: Annotated[bool, Wired("nemo_rl_core.algorithms.prompt_batches:make_dataloader")] = True
    num_workers: Annotated[
        int,
        Check(
            lambda value, context: None,
            "loader worker processes; rows load in-process here, the same rows in the same "
            "order at any value",
        ),
    ] = Field(1, ge=0)
    use_multiple_dataloader: Annotated[
        bool, Only(False, reason="one dataloader per dataset is not built; datasets concatenate")
    ] = False
    num_prompts_per_dataloader: Annotated[int | None, PartOf("data.use_multiple_dataloader")] = None
    custom_dataloader: Annotated[str | None, PartOf("data.use_multiple_dataloader")] = None
    train: DatasetsConfig | None = None
    validation: DatasetsConfig | None = None
    default: DatasetConfig | None = None
    # NeMo RL's pre-v0.5 layout, which v0.7 reads nowhere (some recipes still carry it).
    dataset_name: Annotated[str | None, Only(None, reason=_OLD_LAYOUT)] = None
    prompt_file: Annotated[str | None, Only(None, reason=_OLD_LAYOUT)] = None
    system_prompt_file: Annotated[str | None, Only(None, reason=_OLD_LAYOUT)] = None
    # Validation sets by name: read by DPO and reward models (PreferenceDataConfig's).
    val_data_paths: Annotated[
        dict[str, str] | None,
        Only(
            None,
            reason="NeMo RL reads it only in DPO and reward-model runs (named preference "
            "validation sets), not in this algorithm's; set data.validation instead",
        ),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _fill_from_default(cls, data: Any) -> Any:
        """Each dataset of ``train``/``validation`` takes the keys it does not set from
        ``default`` (NeMo RL's merge), here at validation, so the stored config says what
        each dataset is without ``default``'s help."""
        if not isinstance(data, dict) or not isinstance(data.get("default"), dict | BaseModel):
            return data
        default = _as_dict(data["default"])
        filled = dict(data)
        for split in ("train", "validation"):
            entries = data.get(split)
            if isinstance(entries, list):
                filled[split] = [{**default, **_as_dict(entry)} for entry in entries]
            elif entries is not None:
                filled[split] = {**default, **_as_dict(entries)}
        return filled

    @field_validator("train", "validation", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        """NeMo RL writes one dataset as a mapping and several as a list."""
        return [value] if isinstance(value, dict | BaseModel) else value

    def with_files_from(self, config_dir: Path) -> "DataConfig":
        """This section with each dataset's relative input files (``data_path``,
        ``prompt_file``, ``system_prompt_file``) and ``val_data_paths`` made absolute from
        ``config_dir``: a config runs from any working directory, and the stored config names
        the files it read."""

        def resolved(dataset: DatasetConfig | None) -> DatasetConfig | None:
            if dataset is None:
                return None
            files = {key: input_file(getattr(dataset, key), config_dir) for key in INPUT_FILE_KEYS}
            return dataset.model_copy(update=files)

        named = self.val_data_paths
        return self.model_copy(
            update={
                "default": resolved(self.default),
                "val_data_paths": None
                if named is None
                else {name: input_file(path, config_dir) or path for name, path in named.items()},
                **{
                    split: [resolved(d) for d in getattr(self, split)]
                    for split in ("train", "validation")
                    if getattr(self, split) is not None
                },
            }
        )

    def datasets(self, split: str) -> list[DatasetConfig]:
        """The datasets of ``split`` (``train``/``validation``), ``default`` merged in."""
        entries = self.train if split == "train" else self.validation
        return list(entries or [])

    @property
    def split_from_train(self) -> bool:
        """Whether validation rows are carved out of the training rows (``split_validation_size``)."""
        return any(d.split_validation_size > 0 for d in self.datasets("train"))


_SFT = "nemo_rl_core.algorithms.sft"


class SFTDataConfig(DataConfig):
    """``data:`` of an SFT run: NeMo RL's ``sft.yaml`` adds how ``sft_processor`` tokenizes
    each conversation (a BOS before it, an EOS after it, the generation prompt after each
    user turn)."""

    add_bos: Annotated[bool, Wired(f"{_SFT}:data_setup")] = True
    add_eos: Annotated[bool, Wired(f"{_SFT}:data_setup")] = True
    add_generation_prompt: Annotated[bool, Wired(f"{_SFT}:data_setup")] = False


DEFAULT_VALIDATION_SET = "default"  # NeMo RL's name for data.validation's set


class PreferenceDataConfig(DataConfig):
    """``data:`` of a DPO or reward-model run: NeMo RL's ``setup_preference_data`` also reads
    ``val_data_paths``, validation sets by name, each a ``PreferenceDataset`` file. While it
    names any, they replace ``data.validation``, which NeMo RL then does not read."""

    val_data_paths: Annotated[
        dict[str, str] | None,
        Wired("nemo_rl_core.data.config:PreferenceDataConfig.validation_sets"),
    ] = None

    def datasets(self, split: str) -> list[DatasetConfig]:
        """The datasets of ``split`` the run reads: none of ``validation`` while
        ``val_data_paths`` names the validation sets (:meth:`validation_sets`)."""
        if split == "validation" and self.val_data_paths:
            return []
        return super().datasets(split)

    def validation_sets(self) -> dict[str, DataConfig]:
        """Each validation set by the name its metrics carry (``validation-<name>_loss``),
        as a ``data:`` whose ``validation`` it is: each file of ``val_data_paths`` read as
        ``PreferenceDataset`` rows (no prompt file, nothing from ``default``: NeMo RL names
        only the file), else ``data.validation`` as ``"default"``."""
        if not self.val_data_paths:
            return {DEFAULT_VALIDATION_SET: self}
        sets: dict[str, DataConfig] = {}
        for name, path in self.val_data_paths.items():
            if not Path(path).expanduser().exists():
                raise ConfigError(
                    f"data.val_data_paths.{name}: {path} does not exist (a local "
                    f"{PREFERENCE_DATASET} file: JSONL, Parquet or a save_to_disk folder; "
                    "nothing is downloaded here)"
                )
            dataset = DatasetConfig(dataset_name=PREFERENCE_DATASET, data_path=path)
            sets[name] = self.model_copy(update={"validation": [dataset], "val_data_paths": None})
        return sets


SPLITS = ("train", "validation")
PUZZLE_ENV = "sliding_puzzle_game"
# dataset_name -> the environment (task_name) its rows are scored by
DEFAULT_TASKS = {
    "arithmetic": "math",
    "addition": "math",
    "addition_sft": "math",
    "addition_answer_line": "math",
    "addition_answer_line_sft": "math",
    "addition_preference": "preference",
    "countdown": "countdown",
    LOCAL_DATASET: "math",
    PREFERENCE_DATASET: "preference",
    BINARY_PREFERENCE_DATASET: "preference",
    "sliding_puzzle": PUZZLE_ENV,
}


def task_name(dataset: DatasetConfig) -> str:
    """The environment (``env.<name>``) that scores ``dataset``'s rows."""
    return dataset.env_name or DEFAULT_TASKS.get(dataset.dataset_name or LOCAL_DATASET, "math")


def games_from_environment(config: DataConfig, env: Mapping[str, Any]) -> bool:
    """Whether the run trains and validates on the sliding-puzzle games that ``env`` sets
    up, as NeMo RL's puzzle runner does: ``env`` has the puzzle's section and no dataset of
    ``data:`` is scored by it. That runner reads neither ``data.train`` nor
    ``data.validation`` (``grpo_sliding_puzzle.yaml`` keeps the math dataset it inherits)."""
    if PUZZLE_ENV not in env:
        return False
    return all(task_name(d) != PUZZLE_ENV for split in SPLITS for d in config.datasets(split))
