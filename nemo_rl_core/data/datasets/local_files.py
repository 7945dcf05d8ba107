"""Rows from local files (JSON lines or arrays, Parquet, CSV, Arrow, text) or a ``save_to_disk`` folder.

Every row is normalized to ``{"problem", "expected_answer", ...other columns}`` through
the column mapping (``data.input_key`` / ``data.output_key``), so processors never see a
dataset's own column names; for SFT a chat row (NeMo RL's ``messages`` column: the
OpenAI format) stays a conversation; preference rows (DPO, reward model) take NeMo RL's
``PreferenceDataset`` form. A row without its prompt or answer, a conversation with no
assistant turn to learn, a preference row without a chosen or a rejected response: each
fails here, naming the file, the row index and the column.
"""

import json
from pathlib import Path
from typing import Any


class DatasetRowError(ValueError):
    """A dataset row that lacks a mapped column or holds an unusable value."""


def read_local_rows(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """The raw rows of a local file (by its suffix, as NeMo RL's ``load_dataset_from_path``
    picks the reader: ``.jsonl``/``.json``, ``.parquet``, ``.csv``, ``.arrow``, ``.txt``) or of
    a saved dataset folder."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"dataset path {path} does not exist")
    if path.is_dir():
        return _read_saved_dataset(path, split)
    reader = _FILE_READERS.get(path.suffix)
    if reader is None:
        raise ValueError(
            f"dataset file {path} has suffix {path.suffix!r}; use one of "
            f"{', '.join(_FILE_READERS)}, or a folder written by datasets' save_to_disk"
        )
    return reader(path)


def _read_json(path: Path) -> list[dict[str, Any]]:
    """One object per line, or (as Hugging Face's JSON reader also takes) one array of
    objects for the whole file."""
    text = path.read_text()
    if not text.lstrip().startswith("["):
        return _read_jsonl(path)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as err:
        raise DatasetRowError(f"{path}: not a valid JSON array: {err}") from err
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DatasetRowError(f"{path}: item {index} is a {type(row).__name__}, not an object")
    return rows


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def _read_csv(path: Path) -> list[dict[str, Any]]:
    import pyarrow.csv

    return pyarrow.csv.read_csv(path).to_pylist()


def _read_arrow(path: Path) -> list[dict[str, Any]]:
    """An Arrow IPC stream (what ``datasets`` writes), or an Arrow IPC file."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_stream(source).read_all().to_pylist()
    except pa.ArrowInvalid:
        with pa.memory_map(str(path)) as source:
            return pa.ipc.open_file(source).read_all().to_pylist()


def _read_text(path: Path) -> list[dict[str, Any]]:
    """One ``{"text": line}`` row per line, as Hugging Face's text reader gives them."""
    return [{"text": line} for line in path.read_text().splitlines()]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetRowError(f"{path}: line {line_no} is not valid JSON: {err}") from err
            if not isinstance(row, dict):
                raise DatasetRowError(
                    f"{path}: line {line_no} is a {type(row).__name__}, not an object"
                )
            rows.append(row)
    return rows


# NeMo RL's file_format of a local eval file -> the suffixes read as that format here.
FILE_FORMATS = {"json": (".json", ".jsonl"), "parquet": (".parquet",), "csv": (".csv",)}

_FILE_READERS = {
    ".jsonl": _read_jsonl,
    ".json": _read_json,
    ".parquet": _read_parquet,
    ".csv": _read_csv,
    ".arrow": _read_arrow,
    ".txt": _read_text,
}


def _read_saved_dataset(path: Path, split: str | None) -> list[dict[str, Any]]:
    import datasets

    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        split = split or "train"
        if split not in loaded:
            raise KeyError(f"{path} has splits {sorted(loaded)}, not {split!r} (data.split)")
        loaded = loaded[split]
    return loaded.to_list()


CHAT_COLUMN = "messages"
CHAT_ROLES = ("system", "user", "assistant", "tool")


def map_columns(
    rows: list[dict[str, Any]],
    input_key: str,
    output_key: str,
    source: str,
    chat_rows: bool = False,
    config_keys: tuple[str, str] = ("data.input_key", "data.output_key"),
) -> list[dict[str, Any]]:
    """Rename ``input_key`` -> ``problem`` and ``output_key`` -> ``expected_answer``, checking
    every row; an error names the row, the column and the config key (``config_keys``) that
    chose it.

    With ``chat_rows`` (SFT), a row holding ``messages`` is kept as that conversation, as
    NeMo RL's ``ResponseDataset`` keeps it."""
    mapped = []
    for index, row in enumerate(rows):
        if chat_rows and row.get(CHAT_COLUMN) is not None:
            check_conversation(row[CHAT_COLUMN], f"{source}: row {index}")
            mapped.append(row)
            continue
        for key, config_key in zip((input_key, output_key), config_keys, strict=True):
            value = row.get(key)
            if value is None or (isinstance(value, str) and not value.strip()):
                state = "is empty" if key in row else "has no column"
                raise DatasetRowError(
                    f"{source}: row {index} {state} {key!r} ({config_key}); "
                    f"its columns are {sorted(row)}"
                )
        extra = {k: v for k, v in row.items() if k not in (input_key, output_key)}
        mapped.append({**extra, "problem": row[input_key], "expected_answer": row[output_key]})
    return mapped


def check_conversation(messages: Any, where: str) -> None:
    """A conversation to train on: ``{"role", "content"}`` turns with text, one an assistant's."""
    if not isinstance(messages, list) or not messages:
        raise DatasetRowError(f"{where}: {CHAT_COLUMN!r} must be a non-empty list of turns")
    _check_turns(messages, f"{where}: {CHAT_COLUMN}")
    if not any(turn["role"] == "assistant" for turn in messages):
        raise DatasetRowError(f"{where}: {CHAT_COLUMN!r} has no assistant turn to learn")


def openai_rows(
    rows: list[dict[str, Any]],
    source: str,
    chat_key: str = CHAT_COLUMN,
    system_key: str | None = None,
    system_prompt: str | None = None,
    tool_key: str | None = "tools",
) -> list[dict[str, Any]]:
    """NeMo RL's ``openai_format`` rows as ``messages`` (and ``tools``): the conversation at
    ``chat_key``, after the row's ``system_key`` or else ``system_prompt`` as a system turn;
    it must end with the assistant's turn (what SFT learns)."""
    formatted = []
    for index, row in enumerate(rows):
        where = f"{source}: row {index}"
        if chat_key not in row:
            raise DatasetRowError(
                f"{where} has no column {chat_key!r} (chat_key); its columns are {sorted(row)}"
            )
        messages = list(row[chat_key] or [])
        if system_key is not None and system_key in row:
            messages.insert(0, {"role": "system", "content": row[system_key]})
        elif system_prompt:
            messages.insert(0, {"role": "system", "content": system_prompt})
        check_conversation(messages, where)
        if messages[-1]["role"] != "assistant":
            raise DatasetRowError(f"{where}: the conversation must end with the assistant's turn")
        tools = {"tools": row[tool_key]} if tool_key is not None and tool_key in row else {}
        formatted.append({CHAT_COLUMN: messages, **tools})
    return formatted


def preference_rows(
    rows: list[dict[str, Any]],
    source: str,
    binary_keys: tuple[str, str, str] | None = None,
) -> list[dict[str, Any]]:
    """Rows in NeMo RL's ``PreferenceDataset`` format (``context`` turns, two ranked
    ``completions``), checked row by row; an error names the file, the row and the key.

    ``binary_keys`` (``prompt_key``, ``chosen_key``, ``rejected_key``): the rows are
    ``BinaryPreferenceDataset``'s (a prompt, a chosen and a rejected response), turned into
    that format as NeMo RL does (a text prompt becomes one user turn)."""
    checked = []
    for index, row in enumerate(rows):
        where = f"{source}: row {index}"
        if binary_keys is not None:
            row = _binary_preference(row, where, binary_keys)
        context = row.get("context")
        if not isinstance(context, list) or not context:
            raise DatasetRowError(f"{where}: 'context' must be a non-empty list of turns")
        _check_turns(context, f"{where}: context")
        completions = row.get("completions")
        if not isinstance(completions, list) or len(completions) != 2:
            raise DatasetRowError(
                f"{where}: 'completions' must hold exactly two completions (a chosen and a "
                "rejected one), as NeMo RL's DPO and reward-model training take"
            )
        ranks = []
        for number, completion in enumerate(completions):
            turns = completion.get("completion") if isinstance(completion, dict) else None
            if not isinstance(turns, list) or not turns:
                raise DatasetRowError(
                    f"{where}: completions[{number}] has no 'completion' (a list of turns)"
                )
            _check_turns(turns, f"{where}: completions[{number}].completion")
            rank = completion.get("rank")
            if not isinstance(rank, int) or isinstance(rank, bool):
                raise DatasetRowError(f"{where}: completions[{number}] has no integer 'rank'")
            ranks.append(rank)
        if ranks[0] == ranks[1]:
            raise DatasetRowError(
                f"{where}: both completions have rank {ranks[0]}; ties have no chosen response"
            )
        checked.append(row)
    return checked


def _binary_preference(
    row: dict[str, Any], where: str, keys: tuple[str, str, str]
) -> dict[str, Any]:
    prompt_key, chosen_key, rejected_key = keys
    for key, config_key in zip(keys, ("prompt_key", "chosen_key", "rejected_key"), strict=True):
        value = row.get(key)
        if value is None or (isinstance(value, str) and not value.strip()):
            state = "is empty" if key in row else "has no column"
            raise DatasetRowError(
                f"{where} {state} {key!r} (data.{config_key}); its columns are {sorted(row)}"
            )
    prompt = row[prompt_key]
    context = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
    extra = {k: v for k, v in row.items() if k not in keys}
    return {
        **extra,
        "context": context,
        "completions": [
            {"rank": rank, "completion": [{"role": "assistant", "content": str(row[key])}]}
            for rank, key in ((0, chosen_key), (1, rejected_key))
        ],
    }


def _check_turns(turns: list[Any], where: str) -> None:
    for turn_index, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in CHAT_ROLES:
            raise DatasetRowError(
                f"{where}[{turn_index}] needs a 'role' of {CHAT_ROLES}, got {turn!r}"
            )
        content = turn.get("content")
        if not isinstance(content, str) and not (content is None and turn.get("tool_calls")):
            raise DatasetRowError(f"{where}[{turn_index}] has no text 'content'")
