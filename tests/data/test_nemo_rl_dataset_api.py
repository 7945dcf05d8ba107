"""NeMo RL's dataset API for hand-written loops: ``load_response_dataset``,
``load_preference_dataset``, ``setup_response_data`` / ``setup_preference_data`` and their
helpers. A ported script gets NeMo RL's row shapes, and the same datums a flow builds from
the same ``data:`` section."""

import json
import sys
import types
from pathlib import Path

import datasets
import pytest
import torch
from transformers import AutoTokenizer

from nemo_rl_core.data.config import DataConfig
from nemo_rl_core.data.datasets import (
    AllTaskProcessedDataset,
    extract_necessary_env_names,
    load_eval_dataset,
    load_preference_dataset,
    load_response_dataset,
    merge_datasets,
    update_single_dataset_config,
)
from nemo_rl_core.data.datasets.builder import DataSetup, build_dataset, load_rows
from nemo_rl_core.data.datasets.local_files import DatasetRowError
from nemo_rl_core.data.datasets.response_datasets import ResponseDataset
from nemo_rl_core.data.datasets.utils import load_dataset_from_path
from nemo_rl_core.data.interfaces import TaskDataSpec
from nemo_rl_core.data.processors import (
    PROCESSOR_REGISTRY,
    math_hf_data_processor,
    register_processor,
)
from nemo_rl_core.data.utils import (
    get_train_dataset_name,
    load_dataloader_state,
    setup_preference_data,
    setup_response_data,
)

PAIRS = [{"question": "Hello", "answer": "Hi there!"}, {"question": "2 + 2?", "answer": "4"}]
ROLE_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}{{' Question: ' + m['content'] + "
    "' Answer:'}}{% elif m['role'] == 'assistant' %}{{' ' + m['content']}}{% endif %}"
    "{% endfor %}"
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _write(path: Path, rows: list[dict]) -> str:
    if path.suffix == ".json":
        path.write_text(json.dumps(rows))
    elif path.suffix == ".csv":
        datasets.Dataset.from_list(rows).to_csv(str(path), index=False)
    elif path.suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        datasets.Dataset.from_list(rows).save_to_disk(str(path))
    return str(path)


@pytest.mark.parametrize("name", ["rows.json", "rows.csv", "rows.parquet", "saved"])
def test_response_rows_become_chat_rows_from_any_local_format(tmp_path, tokenizer, name):
    path = _write(tmp_path / name, PAIRS)
    config = {
        "dataset_name": "ResponseDataset",
        "data_path": path,
        "input_key": "question",
        "output_key": "answer",
    }
    dataset = load_response_dataset(config)
    first = dataset.dataset[0]
    assert set(first) == {"messages", "task_name"}
    assert first["task_name"] == dataset.task_name == f"{tmp_path.name}-{name.split('.')[0]}"
    text = tokenizer.apply_chat_template(
        first["messages"], chat_template=ROLE_TEMPLATE, tokenize=False
    )
    assert text == " Question: Hello Answer: Hi there!"
    assert dataset.processor is math_hf_data_processor  # NeMo RL's "default"
    assert dataset.task_spec.task_name == dataset.task_name


def test_a_row_without_its_column_is_refused_naming_file_row_and_key(tmp_path):
    path = _write(tmp_path / "rows.json", [PAIRS[0], {"question": "no answer"}])
    with pytest.raises(DatasetRowError, match=r"row 1 has no column 'answer' \(output_key\)"):
        load_response_dataset(
            {"dataset_name": "ResponseDataset", "data_path": path}
            | {"input_key": "question", "output_key": "answer"}
        )


def test_split_validation_size_holds_out_the_rows_hugging_face_holds_out(tmp_path):
    rows = [{"input": f"q{i}", "output": str(i)} for i in range(17)]
    path = _write(tmp_path / "rows.json", rows)
    dataset = load_response_dataset(
        {"dataset_name": "ResponseDataset", "data_path": path, "split_validation_size": 0.25}
        | {"seed": 3}
    )
    expected = datasets.Dataset.from_list(rows).train_test_split(test_size=0.25, seed=3)
    assert [r["messages"][0]["content"] for r in dataset.val_dataset] == expected["test"]["input"]
    assert len(dataset.dataset) == len(expected["train"])


def test_a_builtin_through_the_registry_gives_the_rows_a_flow_builds():
    section = {"dataset_name": "addition", "num_samples": 6, "seed": 4}
    dataset = load_response_dataset(section)
    flow_rows = load_rows(DataConfig.model_validate({"train": section}))
    assert list(dataset.dataset) == flow_rows
    held_out = load_response_dataset({**section, "split": "validation"})
    assert list(held_out.dataset) == load_rows(
        DataConfig.model_validate({"validation": section}), "validation"
    )
    with pytest.raises(ValueError, match="nmu_samples"):
        load_response_dataset({"dataset_name": "addition", "nmu_samples": 3})


def test_hub_unknown_and_custom_dataset_names(tmp_path):
    with pytest.raises(ValueError, match="'GSM8K': a Hugging Face hub dataset"):
        load_response_dataset({"dataset_name": "GSM8K"})
    with pytest.raises(ValueError, match="'HelpSteer3': a Hugging Face hub dataset"):
        load_preference_dataset({"dataset_name": "HelpSteer3"})
    with pytest.raises(ValueError, match="Unsupported dataset_name='gsm9k'"):
        load_response_dataset({"dataset_name": "gsm9k"})

    class MyDataset(ResponseDataset):
        def __init__(self, **section):
            super().__init__(**section)
            self.dataset = self.dataset.select([0])

    module = types.ModuleType("my_datasets_for_test")
    module.MyDataset = MyDataset
    sys.modules[module.__name__] = module
    try:
        rows = [{"input": "a", "output": "b"}, {"input": "c", "output": "d"}]
        path = tmp_path / "rows.json"
        dataset = load_response_dataset(
            {"dataset_name": "my_datasets_for_test.MyDataset", "data_path": _write(path, rows)}
        )
        assert isinstance(dataset, MyDataset) and len(dataset.dataset) == 1
    finally:
        del sys.modules[module.__name__]


def test_preference_rows_from_a_json_array_and_binary_columns(tmp_path):
    binary = [{"q": "2 + 2?", "good": "4", "bad": "5", "extra": 1}]
    path = _write(tmp_path / "pairs.json", binary)
    dataset = load_preference_dataset(
        {"dataset_name": "BinaryPreferenceDataset", "data_path": path}
        | {"prompt_key": "q", "chosen_key": "good", "rejected_key": "bad"}
    )
    first = dataset.dataset[0]
    assert set(first) == {"context", "completions", "task_name"}
    assert first["context"] == [{"role": "user", "content": "2 + 2?"}]
    assert [c["rank"] for c in first["completions"]] == [0, 1]
    assert first["completions"][1]["completion"][0]["content"] == "5"
    tie = [
        {
            "context": first["context"],
            "completions": [dict(c, rank=0) for c in first["completions"]],
        }
    ]
    with pytest.raises(DatasetRowError, match="row 0: both completions have rank 0"):
        load_preference_dataset(
            {"dataset_name": "PreferenceDataset", "data_path": _write(tmp_path / "tie.json", tie)}
        )


def test_setup_response_data_builds_what_a_flow_builds_and_its_environments(tmp_path, tokenizer):
    section = {
        "max_input_seq_length": 64,
        "train": {"dataset_name": "addition", "num_samples": 8},
        "validation": {"dataset_name": "countdown", "num_samples": 3},
    }
    env = {"math": {"num_workers": 1}, "countdown": {"num_workers": 1}, "unused": {}}
    train, validation, task_to_env, val_task_to_env = setup_response_data(tokenizer, section, env)
    flow = build_dataset(DataConfig.model_validate(section), tokenizer, "train", DataSetup(env=env))
    assert len(train) == len(flow) == 8
    assert torch.equal(
        train[0]["message_log"][0]["token_ids"], flow[0]["message_log"][0]["token_ids"]
    )
    assert len(validation) == 3
    assert set(task_to_env) == {"math"} and set(val_task_to_env) == {"countdown"}
    assert type(task_to_env["math"]).__name__ == "MathEnvironment"
    only_data = setup_response_data(tokenizer, {"train": section["train"]})
    assert len(only_data) == 2 and only_data[1] is None
    with pytest.raises(ValueError, match=r"env.countdown: the datasets are scored"):
        setup_response_data(tokenizer, section, {"math": {}})
    with pytest.raises(ValueError, match="data.train is missing"):
        setup_response_data(tokenizer, {"dataset_name": "addition"})
    with pytest.raises(ValueError, match="shufle"):
        setup_response_data(tokenizer, {**section, "shufle": True})


def test_setup_preference_data_gives_pairs_and_named_validation(tokenizer, tmp_path):
    section = {"train": {"dataset_name": "addition_preference", "num_samples": 6}}
    train, validation = setup_preference_data(tokenizer, section)
    assert len(train) == 6 and validation == {}
    assert {"message_log_chosen", "message_log_rejected"} <= set(train[0])
    with_validation = {**section, "validation": {"dataset_name": "addition_preference"}}
    _, validation = setup_preference_data(tokenizer, with_validation)
    assert list(validation) == ["default"]
    pairs = load_preference_dataset({"dataset_name": "addition_preference", "num_samples": 3})
    path = _write(
        tmp_path / "held.json",
        [{k: r[k] for k in ("context", "completions")} for r in pairs.dataset],
    )
    named = {**with_validation, "val_data_paths": {"held": path}}
    _, validation = setup_preference_data(tokenizer, named)
    assert list(validation) == ["held"] and len(validation["held"]) == 3


def test_preprocessors_run_before_the_processor_and_a_double_bos_is_refused(tokenizer):
    rows = [{"messages": [{"role": "user", "content": "x"}], "task_name": "t"}]

    def add_answer(row):
        return {**row, "messages": [*row["messages"], {"role": "assistant", "content": "y"}]}

    spec = TaskDataSpec(task_name="t")
    dataset = AllTaskProcessedDataset(
        rows, tokenizer, None, {"t": (spec, math_hf_data_processor)}, {"t": add_answer}, 32
    )
    assert dataset[0]["extra_env_info"] == {"ground_truth": "y"}

    def double_bos(row, spec, tok, max_len, idx):
        return {"message_log": [{"role": "user", "token_ids": torch.tensor([7, 7, 5])}]}

    with_bos = types.SimpleNamespace(bos_token_id=7)
    with pytest.raises(AssertionError, match="double BOS"):
        AllTaskProcessedDataset(rows, with_bos, spec, double_bos)[0]
    assert AllTaskProcessedDataset(rows, types.SimpleNamespace(bos_token_id=5), spec, double_bos)[0]


def test_processor_registry_and_small_helpers(tmp_path):
    assert PROCESSOR_REGISTRY["default"] is math_hf_data_processor
    with pytest.raises(ValueError, match="already registered"):
        register_processor("default", math_hf_data_processor)
    section = {"dataset_name": "ResponseDataset", "processor": "no_such_processor"}
    path = _write(tmp_path / "rows.json", [{"input": "a", "output": "b"}])
    with pytest.raises(ValueError, match="processor 'no_such_processor' is not registered"):
        load_response_dataset({**section, "data_path": path})
    entry = {"dataset_name": "x"}
    update_single_dataset_config(entry, {"dataset_name": "y", "env_name": "math"})
    assert entry == {"dataset_name": "x", "env_name": "math"}
    data = {"train": [{"env_name": "math"}, {"env_name": "code"}], "default": {"env_name": "math"}}
    assert extract_necessary_env_names(data) == ["math", "code"]
    merged = merge_datasets([datasets.Dataset.from_list([{"a": 1}])] * 2)
    assert len(merged) == 2 and isinstance(merged, datasets.Dataset)
    assert get_train_dataset_name({"train": [{"dataset_name": "addition"}]}) == "addition"
    assert get_train_dataset_name({"train": {"data_path": "x"}}) is None
    assert load_dataset_from_path(path)[0] == {"input": "a", "output": "b"}  # for users' classes
    with pytest.raises(FileNotFoundError, match="'openai/gsm8k' is not a local file"):
        load_dataset_from_path("openai/gsm8k")


def test_dataloader_state_is_not_restored_across_a_dataset_swap(tmp_path):
    class Loader:
        state = None

        def load_state_dict(self, state):
            self.state = state

    torch.save({"samples_yielded": 12}, tmp_path / "train_dataloader.pt")
    (tmp_path / "config.yaml").write_text("data:\n  train:\n    dataset_name: addition\n")
    same, swapped = Loader(), Loader()
    load_dataloader_state(same, str(tmp_path), {"train": {"dataset_name": "addition"}})
    load_dataloader_state(swapped, str(tmp_path), {"train": {"dataset_name": "countdown"}})
    assert same.state == {"samples_yielded": 12} and swapped.state is None


def test_an_eval_dataset_is_a_local_file_read_through_its_keys(tmp_path, tokenizer):
    path = tmp_path / "math.csv"
    path.write_text("q,a\nWhat is 1 + 1?,2\nWhat is 2 + 3?,5\n")
    section = {"dataset_name": str(path), "problem_key": "q", "solution_key": "a"}
    dataset = load_eval_dataset(section)  # NeMo RL reads CSV unless file_format says otherwise
    assert dataset.rekeyed_ds[1] == {"problem": "What is 2 + 3?", "expected_answer": 5}
    datum = AllTaskProcessedDataset(
        dataset.rekeyed_ds, tokenizer, dataset.task_spec, dataset.processor, max_seq_length=64
    )[0]
    assert datum["extra_env_info"] == {"ground_truth": "2"}
    with pytest.raises(ValueError, match="file_format='json' does not read"):
        load_eval_dataset({**section, "file_format": "json"})
    with pytest.raises(ValueError, match="'aime2024' is not a local file"):
        load_eval_dataset({**section, "dataset_name": "aime2024"})


USER_MODULE = '''
from datasets import Dataset

from nemo_rl_core.data.datasets.raw_dataset import RawDataset


class Sums(RawDataset):
    """A user's dataset class, as NeMo RL's docs show one: rows of chat messages."""

    def __init__(self, count=4, data_path=None, **kwargs):
        self.task_name = "sums"
        rows = [
            {"messages": [{"role": "user", "content": f"{i} + {i}?"},
                          {"role": "assistant", "content": str(2 * i)}]}
            for i in range(count)
        ]
        self.dataset = Dataset.from_list(rows)
'''


def test_a_users_dataset_class_runs_by_its_import_path_in_a_config(
    tmp_path, tokenizer, monkeypatch
):
    """NeMo RL imports a dotted dataset_name as the user's class; a flow's data: does too,
    processing its rows with NeMo RL's own processor of that name."""
    (tmp_path / "user_sums.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    section = {"dataset_name": "user_sums.Sums", "max_samples": 5, "seed": 1}
    config = DataConfig.model_validate({"train": section})
    rows = load_rows(config)
    assert len(rows) == 4 and rows[1]["task_name"] == "math"  # scored by env.math
    datum = build_dataset(config, tokenizer)[3]
    assert datum["extra_env_info"] == {"ground_truth": "6"}
    assert "3 + 3?" in datum["message_log"][0]["content"]
    carved = DataConfig.model_validate({"train": {**section, "split_validation_size": 0.5}})
    held = [r["messages"][0]["content"] for r in load_rows(carved, "validation")]
    trained = [r["messages"][0]["content"] for r in load_rows(carved)]
    assert len(held) == len(trained) == 2 and not set(held) & set(trained)
    missing = DataConfig.model_validate({"train": {"dataset_name": "user_sums.Missing"}})
    with pytest.raises(ValueError, match="Module 'user_sums' has no attribute 'Missing'"):
        load_rows(missing)
    with pytest.raises(ValueError, match="dataset_name 'sums' is unknown"):
        DataConfig.model_validate({"train": {"dataset_name": "sums"}})


def test_a_hub_dataset_in_a_scripts_data_section_is_refused_not_replaced(tokenizer):
    """The config check refuses hub datasets before a flow starts; a script's
    setup_response_data has no such check, so the builder itself says why."""
    with pytest.raises(ValueError, match="'GSM8K': a Hugging Face hub dataset"):
        setup_response_data(tokenizer, {"train": {"dataset_name": "GSM8K"}})
