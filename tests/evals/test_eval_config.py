"""An eval config is NeMo RL's run_eval YAML; what cannot work is refused before any work,
naming the key, the file and the row."""

import json
from pathlib import Path

import pytest
from python_forks import PythonForks

from nemo_rl_core.evals.config import EvalDataConfig
from nemo_rl_core.evals.config_check import check_eval_config, eval_rows
from nemo_rl_core.utils.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "examples/configs/eval_addition_tiny.yaml")
TINY = "generation.model_name=tiny-llama"  # built in seconds: these tests never generate


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_a_local_file_is_read_through_problem_and_solution_keys(tmp_path: Path):
    data = write_rows(tmp_path / "qa.jsonl", [{"q": "What is 1 + 1?", "a": "2"}])
    config = check_eval_config(
        CONFIG, [TINY, f"data.dataset_name={data}", "data.problem_key=q", "data.solution_key=a"]
    )
    assert config.data.dataset_name == str(data)


def test_a_csv_file_runs_as_nemo_rl_reads_it_by_default(tmp_path: Path):
    """NeMo RL's local eval dataset reads CSV unless file_format says otherwise."""
    data = tmp_path / "qa.csv"
    data.write_text("q,a\nWhat is 1 + 1?,2\nWhat is 2 + 3?,5\n")
    config = check_eval_config(
        CONFIG,
        [TINY, f"data.dataset_name={data}", "data.problem_key=q", "data.solution_key=a"]
        + ["data.file_format=csv"],
    )
    rows = eval_rows(config.data)
    assert [(r["problem"], str(r["expected_answer"])) for r in rows] == [
        ("What is 1 + 1?", "2"),
        ("What is 2 + 3?", "5"),
    ]


def test_a_row_without_its_answer_is_refused_naming_file_row_and_key(tmp_path: Path):
    rows = [{"problem": "What is 1 + 1?", "expected_answer": "2"}, {"problem": "What is 2 + 2?"}]
    data = write_rows(tmp_path / "qa.jsonl", rows)
    with pytest.raises(ConfigError) as err:
        check_eval_config(CONFIG, [TINY, f"data.dataset_name={data}"])
    text = str(err.value)
    assert f"{data}: row 1 has no column 'expected_answer' (data.solution_key)" in text


def test_a_checkpoint_that_does_not_exist_is_refused(tmp_path: Path):
    missing = tmp_path / "runs/x/checkpoints/step_000009"
    with pytest.raises(ConfigError, match=r"generation\.model_name: model .*step_000009"):
        check_eval_config(CONFIG, [f"generation.model_name={missing}"])


def test_a_missing_dataset_file_is_refused(tmp_path: Path):
    with pytest.raises(ConfigError, match=r"data\.dataset_name: dataset path .*nothere"):
        check_eval_config(CONFIG, [TINY, f"data.dataset_name={tmp_path / 'nothere.jsonl'}"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["eval.k_value=2"], "k_value=2 exceeds num_tests_per_prompt=1"),
        (["eval.num_tests_per_prompt=4"], "needs generation.temperature > 0"),
        (
            ["data.dataset_name=aime2024"],
            "data.dataset_name='aime2024': a dataset NeMo RL downloads",
        ),
        (["eval.metric=maj@k"], "eval.metric: Input should be 'pass@k' or 'cons@k'"),
        (
            [
                "eval.metric=cons@k",
                "eval.num_tests_per_prompt=40",
                "eval.k_value=20",
                "generation.temperature=1.0",
            ],
            "C(40, 20) = 137846528820 subsets",
        ),
        (["data.file_format=xml"], "data.file_format='xml'"),
        (["+eval.pass_k_value=2"], "eval.pass_k_value: unknown key"),
        (["~env.math"], "env.math: the rows are scored by environment 'math'"),
    ],
)
def test_what_cannot_run_is_refused_by_key(overrides, message):
    with pytest.raises(ConfigError) as err:
        check_eval_config(CONFIG, [TINY, *overrides])
    assert message in str(err.value)


def test_the_command_line_refuses_before_any_work_in_one_line(
    tmp_path: Path, python_forks: PythonForks
):
    """``python -m flows.eval``, in a process of its own (tests/python_forks.py)."""
    missing = tmp_path / "checkpoints" / "step_000004"
    done = python_forks.run(
        "import runpy\nrunpy.run_module('flows.eval', run_name='__main__', alter_sys=True)",
        [
            "--config",
            CONFIG,
            "--storage-root",
            str(tmp_path / "storage"),
            f"generation.model_name={missing}",
        ],
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: ") and f"generation.model_name: model '{missing}'" in line
    assert not (tmp_path / "storage").exists()


def test_a_builtin_draws_its_held_out_rows_unless_split_says_train():
    held_out = eval_rows(EvalDataConfig(dataset_name="addition", num_samples=8))
    trained = eval_rows(EvalDataConfig(dataset_name="addition", num_samples=8, split="train"))
    assert {row["problem"] for row in held_out}.isdisjoint(row["problem"] for row in trained)
    assert all(row["task_name"] == "math" and row["expected_answer"] for row in held_out)
    with pytest.raises(ValueError, match="split='test'"):
        EvalDataConfig(dataset_name="addition", split="test")
    with pytest.raises(ConfigError, match=r"row 0 has no column 'question' \(data.problem_key\)"):
        check_eval_config(CONFIG, [TINY, "data.problem_key=question"])
