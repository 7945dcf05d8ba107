"""Rows from local files: JSONL, Parquet, or a ``datasets.save_to_disk`` folder.

Every row is normalized to ``{"problem", "expected_answer", ...other columns}`` through
the column mapping (``data.input_key`` / ``data.output_key``), so processors never see a
dataset's own column names; for SFT a chat row (NeMo RL's ``messages`` column: the
OpenAI format) stays a conversation. A row without its prompt or answer, or whose
conversation has no assistant turn to learn, fails here, naming the file, the row index
and the column.
"""

import json
from pathlib import Path
from typing import Any


class DatasetRowError(ValueError):
    """A dataset row that lacks a mapped column or holds an unusable value."""


def read_local_rows(path: str | Path, split: str | None = None) -> list[dict[str, Any]]:
    """The raw rows of a ``.jsonl``/``.json`` file, a ``.parquet`` file or a saved dataset folder."""
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"dataset path {path} does not exist")
    if path.is_dir():
        return _read_saved_dataset(path, split)
    if path.suffix in (".jsonl", ".json"):
        return _read_jsonl(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(
        f"dataset file {path} has suffix {path.suffix!r}; use .jsonl, .json (one object per "
        "line), .parquet, or a folder written by datasets' save_to_disk"
    )


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
    for turn_index, turn in enumerate(messages):
        turn_where = f"{where}: {CHAT_COLUMN}[{turn_index}]"
        if not isinstance(turn, dict) or turn.get("role") not in CHAT_ROLES:
            raise DatasetRowError(f"{turn_where} needs a 'role' of {CHAT_ROLES}, got {turn!r}")
        if not isinstance(turn.get("content"), str):
            raise DatasetRowError(f"{turn_where} has no text 'content'")
    if not any(turn["role"] == "assistant" for turn in messages):
        raise DatasetRowError(f"{where}: {CHAT_COLUMN!r} has no assistant turn to learn")
