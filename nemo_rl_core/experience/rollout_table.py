"""Rollouts a person can read: one row per sample, written as Parquet for pandas, polars and
DuckDB (``select * from '<run log folder>/rollouts/*.parquet'``).

A row holds the prompt and response as text, the reward, the ground truth and the
environment's reason when it gave them (the rest of its info as JSON), and the token
lengths. Multi-turn episodes put every turn after the prompt in ``response``, each marked
with its role.
"""

import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict

SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("iteration", pa.int32()),
        ("sample", pa.int32()),
        ("prompt_index", pa.int64()),
        ("task_name", pa.string()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        ("reward", pa.float64()),
        ("ground_truth", pa.string()),
        ("reason", pa.string()),
        ("env_info", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("response_tokens", pa.int32()),
        ("truncated", pa.bool_()),
        ("greedy", pa.bool_()),
    ]
)
# Keys of an environment's info that get their own column.
_OWN_COLUMNS = ("ground_truth", "reward_reason")


def _split_turns(message_log: list[dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """The messages before the first assistant turn, and the rest."""
    first = next((i for i, m in enumerate(message_log) if m["role"] == "assistant"), None)
    if first is None:
        return message_log, []
    return message_log[:first], message_log[first:]


def _text(messages: list[dict[str, Any]], with_roles: bool) -> str:
    if not with_roles:
        return "".join(str(m.get("content", "")) for m in messages)
    return "\n".join(f"[{m['role']}] {m.get('content', '')}" for m in messages)


def _tokens(messages: list[dict[str, Any]], role: str | None = None) -> int:
    return sum(len(m["token_ids"]) for m in messages if role is None or m["role"] == role)


def _column(batch: BatchedDataDict, key: str, size: int, default: Any) -> list[Any]:
    if key not in batch:
        return [default] * size
    value = batch[key]
    return value.tolist() if isinstance(value, torch.Tensor) else list(value)


def rollout_table(batch: BatchedDataDict, run_id: str, iteration: int) -> pa.Table:
    """The readable table of a scored batch (the reward stage's or validation's output)."""
    size = len(batch["message_log"])
    infos = [info or {} for info in _column(batch, "extra_env_info", size, None)]
    rows: dict[str, list[Any]] = {name: [] for name in SCHEMA.names}
    for message_log in batch["message_log"]:
        prompt, response = _split_turns(message_log)
        rows["prompt"].append(_text(prompt, with_roles=False))
        rows["response"].append(_text(response, with_roles=len(response) > 1))
        rows["prompt_tokens"].append(_tokens(prompt))
        rows["response_tokens"].append(_tokens(response, role="assistant"))
    rows["run_id"] = [run_id] * size
    rows["iteration"] = [iteration] * size
    rows["sample"] = list(range(size))
    rows["prompt_index"] = _column(batch, "prompt_index", size, None)
    rows["task_name"] = _column(batch, "task_name", size, None)
    rows["reward"] = [float(r) for r in _column(batch, "total_reward", size, float("nan"))]
    rows["ground_truth"] = [_optional_str(info.get("ground_truth")) for info in infos]
    rows["reason"] = [_optional_str(info.get("reward_reason")) for info in infos]
    rows["env_info"] = [_rest_as_json(info) for info in infos]
    rows["truncated"] = [bool(t) for t in _column(batch, "truncated", size, False)]
    rows["greedy"] = [bool(g) for g in _column(batch, "greedy", size, False)]
    return pa.Table.from_pydict(rows, schema=SCHEMA)


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _rest_as_json(info: dict[str, Any]) -> str | None:
    rest = {k: v for k, v in info.items() if k not in _OWN_COLUMNS}
    return json.dumps(rest, default=str, sort_keys=True) if rest else None


def write_parquet(table: pa.Table, path: Path) -> Path:
    """Write ``table`` to ``path`` whole: a reader globbing ``*.parquet`` never sees half a
    file (it is written under a name outside the glob, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    pq.write_table(table, partial)
    os.replace(partial, path)
    return path


def format_samples(table: pa.Table, count: int, width: int = 400) -> str:
    """The first ``count`` rows for the terminal (NeMo RL's ``num_val_samples_to_print``);
    texts longer than ``width`` characters are cut."""

    def cut(text: str | None) -> str:
        text = " ".join((text or "").split())  # one line each: chat templates hold newlines
        return text if len(text) <= width else text[:width] + " ..."

    blocks = []
    for row in table.slice(0, count).to_pylist():
        head = f"sample {row['sample']} (prompt {row['prompt_index']}): reward {row['reward']:g}"
        if row["ground_truth"] is not None:
            head += f", ground truth {row['ground_truth']}"
        if row["reason"] is not None:
            head += f", {row['reason']}"
        blocks.append(
            f"{head}\n  prompt:   {cut(row['prompt'])}\n  response: {cut(row['response'])}"
        )
    return "\n".join(blocks)
