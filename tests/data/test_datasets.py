"""Datasets: local files with a column mapping, seeded generators, DataConfig, DatumSpecs."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import AutoTokenizer

from nemo_rl_core.data.config import DataConfig
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import DataSetup, build_dataset, load_rows
from nemo_rl_core.data.datasets.generators import (
    arithmetic_word_problems,
    countdown_puzzles,
    sliding_puzzle_games,
)
from nemo_rl_core.data.datasets.local_files import DatasetRowError
from nemo_rl_core.utils.key_support import Machine, UnsupportedConfigError, check_support

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i} for i in range(6)]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _local_config(path, **kwargs) -> DataConfig:
    return DataConfig.model_validate(
        {
            "train": {
                "dataset_name": "ResponseDataset",
                "data_path": str(path),
                "input_key": "question",
                "output_key": "answer",
                **kwargs,
            }
        }
    )


def _builtin(name: str, data: dict | None = None, **dataset) -> DataConfig:
    return DataConfig.model_validate({"train": {"dataset_name": name, **dataset}, **(data or {})})


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_parquet_and_saved_dataset_give_the_same_rows(tmp_path):
    import datasets

    jsonl = _write_jsonl(tmp_path / "train.jsonl", ROWS)
    parquet = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), parquet)
    saved = tmp_path / "saved"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(saved))
    loaded = [load_rows(_local_config(p)) for p in (jsonl, parquet, saved)]
    assert loaded[0] == loaded[1] == loaded[2]
    assert loaded[0][3] == {
        "problem": "What is 3 + 3?",
        "expected_answer": "6",
        "level": 3,
        "task_name": "math",
    }
    with pytest.raises(KeyError, match=r"splits \['train'\], not 'test' \(data.split\)"):
        load_rows(_local_config(saved, split="test"))


def test_missing_prompt_or_answer_names_row_and_column(tmp_path):
    rows = [dict(r) for r in ROWS]
    del rows[2]["question"]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetRowError, match=r"row 2 has no column 'question' \(data.input_key\)"):
        load_rows(_local_config(path))
    rows = [dict(r) for r in ROWS]
    rows[4]["answer"] = ""
    parquet = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    with pytest.raises(DatasetRowError, match=r"row 4 is empty 'answer' \(data.output_key\)"):
        load_rows(_local_config(parquet))


def test_bad_json_line_and_bad_suffix_are_named(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DatasetRowError, match="line 2 is not valid JSON"):
        load_rows(_local_config(path))
    xml = tmp_path / "rows.xml"
    xml.write_text("<rows/>")
    with pytest.raises(ValueError, match="suffix '.xml'"):
        load_rows(_local_config(xml))
    array = tmp_path / "array.json"
    array.write_text("[1, 2]")
    with pytest.raises(DatasetRowError, match="item 0 is a int, not an object"):
        load_rows(_local_config(array))


def test_json_arrays_csv_arrow_and_text_files_are_read_as_hugging_face_reads_them(tmp_path):
    """NeMo RL reads a local file with Hugging Face's reader of its suffix: these load there."""
    import datasets

    expected = load_rows(_local_config(_write_jsonl(tmp_path / "rows.jsonl", ROWS)))
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(ROWS))
    assert load_rows(_local_config(array)) == expected
    csv = tmp_path / "rows.csv"
    datasets.Dataset.from_list(ROWS).to_csv(str(csv), index=False)
    assert [(r["problem"], str(r["expected_answer"])) for r in load_rows(_local_config(csv))] == [
        (r["problem"], r["expected_answer"]) for r in expected
    ]
    arrow = tmp_path / "rows.arrow"
    with (
        pa.OSFile(str(arrow), "wb") as sink,
        pa.ipc.new_stream(sink, pa.Table.from_pylist(ROWS).schema) as writer,
    ):
        writer.write_table(pa.Table.from_pylist(ROWS))
    assert load_rows(_local_config(arrow)) == expected
    text = tmp_path / "rows.txt"
    text.write_text("first line\nsecond line\n")
    rows = load_rows(_local_config(text, input_key="text", output_key="text"))
    assert [r["problem"] for r in rows] == ["first line", "second line"]


def test_data_config_errors_name_the_key():
    with pytest.raises(ValueError, match="shuffel"):
        DataConfig.model_validate({"shuffel": True})
    with pytest.raises(ValueError, match=r"dataset_name 'gsm9k' is unknown"):
        _builtin("gsm9k")
    with pytest.raises(ValueError, match="data_path is required"):
        _builtin("ResponseDataset")
    with pytest.raises(ValueError, match="processor 'nope' is unknown"):
        _builtin("arithmetic", processor="nope")


def test_hub_datasets_validate_and_are_refused_before_any_work():
    config = _builtin("OpenMathInstruct-2")
    with pytest.raises(UnsupportedConfigError, match=r"train.0.dataset_name='OpenMathInstruct-2'"):
        check_support(config, Machine(cuda_devices=0))
    check_support(_builtin("arithmetic"), Machine(cuda_devices=0))


def test_datasets_take_unset_keys_from_default_and_keep_their_own():
    config = DataConfig.model_validate(
        {
            "train": [{"dataset_name": "arithmetic"}, {"dataset_name": "countdown", "seed": 3}],
            "validation": {"dataset_name": "arithmetic", "env_name": None},
            "default": {"env_name": "math", "seed": 9, "num_samples": 4},
        }
    )
    train = config.datasets("train")
    assert [(d.dataset_name, d.seed, d.num_samples, d.env_name) for d in train] == [
        ("arithmetic", 9, 4, "math"),
        ("countdown", 3, 4, "math"),
    ]
    assert config.datasets("validation")[0].env_name is None  # set explicitly: kept
    again = DataConfig.model_validate(config.model_dump())  # as a stored run reads it back
    assert again.datasets("train") == train
    rows = load_rows(config)
    assert len(rows) == 8 and rows[0]["task_name"] == "math"


def test_split_validation_size_carves_validation_rows_out_of_training():
    config = _builtin("arithmetic", num_samples=40, split_validation_size=0.25, seed=5)
    train, held = load_rows(config), load_rows(config, "validation")
    assert len(train) == 30 and len(held) == 10
    assert not {r["problem"] for r in train} & {r["problem"] for r in held}
    assert load_rows(config, "validation") == held  # seeded


def test_split_validation_holds_out_the_rows_nemo_rl_holds_out(tmp_path):
    """The same rows as Hugging Face's train_test_split (which NeMo RL calls), by share and
    by count."""
    import datasets

    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(23)]
    path = _write_jsonl(tmp_path / "rows.jsonl", rows)
    for size in (0.3, 5):
        config = _local_config(path, split_validation_size=size, seed=11)
        split = datasets.Dataset.from_list(rows).train_test_split(test_size=size, seed=11)
        assert [r["problem"] for r in load_rows(config)] == split["train"]["question"]
        held = [r["problem"] for r in load_rows(config, "validation")]
        assert held == split["test"]["question"]


def test_split_validation_size_of_one_or_more_is_a_row_count():
    """NeMo RL's train_test_split reads 64 as 64 rows, not a share."""
    config = _builtin("arithmetic", num_samples=40, split_validation_size=7, seed=5)
    assert len(load_rows(config)) == 33 and len(load_rows(config, "validation")) == 7
    everything = _builtin("arithmetic", num_samples=40, split_validation_size=40)
    with pytest.raises(ValueError, match="split_validation_size=40 holds out 40 of the 40 rows"):
        load_rows(everything)


def test_max_samples_is_refused_where_nemo_rl_would_cap_rows(tmp_path):
    """A cap on NeMo RL's hub datasets; its local ResponseDataset takes it as a stray
    keyword and ignores it, which is what happens here too."""
    with pytest.raises(UnsupportedConfigError, match=r"train.0.max_samples=5: NeMo RL caps"):
        check_support(_builtin("arithmetic", max_samples=5), Machine(cuda_devices=0))
    local = _local_config(_write_jsonl(tmp_path / "rows.jsonl", ROWS), max_samples=2)
    check_support(local, Machine(cuda_devices=0))
    assert len(load_rows(local)) == len(ROWS)


def test_the_pre_v05_data_layout_loads_and_is_refused():
    """NeMo RL v0.7 reads no top-level data.dataset_name; a recipe that still sets one would
    train on data.train's dataset, not the one it names."""
    config = _builtin("arithmetic", data={"dataset_name": "DAPOMath17K", "prompt_file": None})
    with pytest.raises(
        UnsupportedConfigError, match="^.*: dataset_name='DAPOMath17K': NeMo RL's pre-v0.5"
    ):
        check_support(config, Machine(cuda_devices=0))


def test_repeat_repeats_each_row():
    rows = load_rows(_builtin("arithmetic", num_samples=3, repeat=2))
    assert [r["problem"] for r in rows[::2]] == [r["problem"] for r in rows[1::2]]


def test_puzzle_games_come_from_the_environment_settings_without_data_train(tokenizer):
    env = {"sliding_puzzle_game": {"cfg": {"game_config": {"size": 3, "shuffle_moves": 5}}}}
    setup = DataSetup(env=env, puzzle_counts={"train": 6})
    rows = load_rows(DataConfig(), setup=setup)
    assert len(rows) == 6 and {r["task_name"] for r in rows} == {"sliding_puzzle_game"}
    sizes = [r["game_state"]["size"] for r in rows]
    assert set(sizes) <= {2, 3} and len(set(sizes)) == 2  # drawn up to the configured size


def test_generators_are_seeded_and_consistent():
    assert arithmetic_word_problems(20, 1) == arithmetic_word_problems(20, 1)
    assert arithmetic_word_problems(20, 1) != arithmetic_word_problems(20, 2)
    for row in arithmetic_word_problems(50, 0):
        assert row["expected_answer"].isdigit() and "?" in row["problem"]
    puzzles = countdown_puzzles(30, 5)
    assert puzzles == countdown_puzzles(30, 5)
    for row in puzzles:
        assert int(row["expected_answer"]) > 0 and len(row["numbers"]) == 4
        assert str(row["numbers"]) in row["problem"]
    games = sliding_puzzle_games(3, seed=9)
    assert games == sliding_puzzle_games(3, seed=9) and games[0] != games[1]


def test_built_dataset_prompts_are_templated_and_accounted(tokenizer, tmp_path):
    prompt = tmp_path / "cot.txt"
    prompt.write_text("Think step by step. {}")
    system = tmp_path / "system.txt"
    system.write_text("You are a helpful model.")
    config = _builtin(
        "arithmetic", num_samples=8, prompt_file=str(prompt), system_prompt_file=str(system)
    )
    dataset = build_dataset(config, tokenizer)
    datum = dataset[3]
    row = load_rows(config)[3]
    messages = [
        {"role": "system", "content": "You are a helpful model."},
        {"role": "user", "content": f"Think step by step. {row['problem']}"},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    flat_ids = [t for m in datum["message_log"] for t in m["token_ids"].tolist()]
    assert flat_ids == expected_ids and datum["length"] == len(expected_ids)
    assert [m["role"] for m in datum["message_log"]] == ["system", "user"]
    assert datum["extra_env_info"] == {"ground_truth": row["expected_answer"]}
    assert datum["task_name"] == "math" and datum["loss_multiplier"] == 1.0 and datum["idx"] == 3


def test_prompt_longer_than_max_input_is_cut_and_masked(tokenizer):
    dataset = build_dataset(_builtin("arithmetic", {"max_input_seq_length": 8}), tokenizer)
    datum = dataset[0]
    assert datum["length"] <= 8 and datum["loss_multiplier"] == 0.0


def test_countdown_and_puzzle_datasets_carry_env_info(tokenizer):
    countdown = build_dataset(_builtin("countdown", num_samples=4), tokenizer)[0]
    assert countdown["task_name"] == "countdown" and "numbers" in countdown["extra_env_info"]
    puzzle = build_dataset(_builtin("sliding_puzzle", num_samples=2), tokenizer)[1]
    assert puzzle["task_name"] == "sliding_puzzle_game"
    assert puzzle["extra_env_info"]["num_moves"] == 0 and puzzle["stop_strings"] == ["</action>"]


def test_dataloader_over_datums_resumes_at_the_next_prompt(tokenizer):
    config = _builtin("arithmetic", num_samples=10, seed=7)
    dataset = build_dataset(config, tokenizer)
    straight = StatefulDataLoader(dataset, 4, seed=7)
    expected = [straight.next_batch()["idx"] for _ in range(5)]
    first = StatefulDataLoader(dataset, 4, seed=7)
    seen = [first.next_batch()["idx"] for _ in range(3)]
    resumed = StatefulDataLoader(build_dataset(config, tokenizer), 4, seed=7)
    resumed.load_state_dict(first.state_dict())
    seen += [resumed.next_batch()["idx"] for _ in range(2)]
    assert seen == expected
    batch = resumed.next_batch().repeat_interleave(3)
    assert batch["idx"][:3] == [batch["idx"][0]] * 3 and batch["length"].shape == (12,)
