"""Readable rollouts: texts, rewards, ground truths and reasons as Parquet that pandas,
polars and DuckDB (with no extension to fetch) read as one table per folder."""

import duckdb
import pandas as pd
import polars as pl
import pytest
import torch

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.experience.rollout_table import format_samples, rollout_table, write_parquet


def message(role: str, content: str, tokens: int) -> dict:
    return {"role": role, "content": content, "token_ids": torch.arange(tokens)}


def scored_batch(iteration: int) -> BatchedDataDict:
    """Two one-turn math answers and one two-turn episode, as the reward stage stores them."""
    return BatchedDataDict(
        message_log=[
            [message("user", "What is 2+3?", 7), message("assistant", r"\boxed{5}", 4)],
            [message("user", "What is 2+3?", 7), message("assistant", r"\boxed{6}", 5)],
            [
                message("system", "Play.", 2),
                message("user", "Board: 1 2 _", 6),
                message("assistant", "right", 1),
                message("environment", "Board: 1 _ 2", 6),
                message("assistant", "left", 1),
            ],
        ],
        total_reward=torch.tensor([1.0, 0.0, 0.5 * iteration]),
        prompt_index=torch.tensor([0, 0, 1]),
        task_name=["math", "math", "puzzle"],
        truncated=torch.tensor([False, False, True]),
        extra_env_info=[
            {"ground_truth": "5", "reward_reason": "correct", "extracted_answer": "5"},
            {"ground_truth": "5", "reward_reason": "wrong answer", "extracted_answer": "6"},
            None,
        ],
    )


@pytest.fixture
def rollouts_dir(tmp_path):
    for iteration in (0, 1):
        table = rollout_table(scored_batch(iteration), "run-a", iteration)
        write_parquet(table, tmp_path / "rollouts" / f"iter_{iteration:06d}.parquet")
    return tmp_path / "rollouts"


def test_rows_hold_the_texts_rewards_and_the_environments_reasons():
    rows = rollout_table(scored_batch(2), "run-a", 2).to_pylist()
    assert rows[0] == {
        "run_id": "run-a",
        "iteration": 2,
        "sample": 0,
        "prompt_index": 0,
        "task_name": "math",
        "prompt": "What is 2+3?",
        "response": r"\boxed{5}",
        "reward": 1.0,
        "ground_truth": "5",
        "reason": "correct",
        "env_info": '{"extracted_answer": "5"}',
        "prompt_tokens": 7,
        "response_tokens": 4,
        "truncated": False,
        "greedy": False,
    }
    episode = rows[2]
    assert episode["prompt"] == "Play.Board: 1 2 _"
    assert episode["response"] == "[assistant] right\n[environment] Board: 1 _ 2\n[assistant] left"
    assert (episode["prompt_tokens"], episode["response_tokens"]) == (8, 2)
    assert (episode["ground_truth"], episode["reason"], episode["env_info"]) == (None,) * 3
    assert episode["reward"] == 1.0 and episode["truncated"]


def test_pandas_polars_and_duckdb_read_the_folder(rollouts_dir):
    frame = pd.read_parquet(rollouts_dir).sort_values(["iteration", "sample"])
    assert frame["reward"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.5]
    polars_frame = pl.read_parquet(rollouts_dir / "*.parquet")
    assert polars_frame.filter(pl.col("reason") == "correct").height == 2
    # No extension may be fetched: Parquet must be built in.
    connection = duckdb.connect(
        config={"autoinstall_known_extensions": False, "autoload_known_extensions": False}
    )
    rows = connection.sql(
        f"select iteration, avg(reward) as mean_reward, count(*) as n "
        f"from '{rollouts_dir}/*.parquet' group by iteration order by iteration"
    ).fetchall()
    assert rows == [(0, pytest.approx(1 / 3), 3), (1, pytest.approx(0.5), 3)]


def test_a_partly_written_file_is_outside_the_glob(tmp_path):
    path = write_parquet(rollout_table(scored_batch(0), "run-a", 0), tmp_path / "x.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]


def test_samples_for_the_terminal():
    table = rollout_table(scored_batch(0), "run-a", 0)
    text = format_samples(table, 2, width=5)
    assert text.splitlines() == [
        "sample 0 (prompt 0): reward 1, ground truth 5, correct",
        "  prompt:   What  ...",
        r"  response: \boxe ...",
        "sample 1 (prompt 0): reward 0, ground truth 5, wrong answer",
        "  prompt:   What  ...",
        r"  response: \boxe ...",
    ]
