"""Preference data (DPO, reward models): NeMo RL's PreferenceDataset and
BinaryPreferenceDataset rows from local JSONL/Parquet and the built-in addition pairs,
through ``preference_preprocessor`` into interleaved chosen/rejected tensors; validation
sets by name (``data.val_data_paths``); and what is refused, before any work, with the
file, row and key named."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from flows.config_check import check_run_config
from flows.run_setup import config_notes
from nemo_rl_core.algorithms import dpo, rm
from nemo_rl_core.algorithms.dpo import (
    DPOMasterConfig,
    data_setup,
    make_dataloader,
    validation_batches,
)
from nemo_rl_core.algorithms.grpo import MasterConfig, load_master_config
from nemo_rl_core.algorithms.loss import DPOLossFn, PreferenceLossFn
from nemo_rl_core.algorithms.rm import RMMasterConfig
from nemo_rl_core.algorithms.sft import SFTMasterConfig
from nemo_rl_core.algorithms.training import train_policy
from nemo_rl_core.data.datasets.generators import addition_preferences, carry_mistake
from nemo_rl_core.data.datasets.local_files import DatasetRowError
from nemo_rl_core.models.policy import make_policy
from nemo_rl_core.utils.config import ConfigError
from nemo_rl_core.utils.key_support import UnsupportedConfigError

ROOT = Path(__file__).resolve().parents[2]
DPO_CONFIG = ROOT / "examples" / "configs" / "dpo_tiny.yaml"
RM_CONFIG = ROOT / "examples" / "configs" / "rm_tiny.yaml"
NO_VALIDATION = ["dpo.val_at_start=false", "dpo.val_period=0", "data.validation=null"]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def dpo_config(tiny_model_dir, *overrides: str) -> DPOMasterConfig:
    config = load_master_config(
        str(DPO_CONFIG), [f"policy.model_name={tiny_model_dir}", *overrides], DPOMasterConfig
    )
    assert isinstance(config, DPOMasterConfig)
    return config


def local_train(name: str, path: Path, *keys: str) -> list[str]:
    return [
        f"data.train.dataset_name={name}",
        f"++data.train.data_path={path}",
        "data.train.num_samples=null",
        *(f"++data.train.{key}" for key in keys),
        *NO_VALIDATION,
    ]


def decoded_pairs(config: DPOMasterConfig, tokenizer) -> list[tuple[str, str]]:
    """(chosen, rejected) completion text of each pair of the first training batch."""
    batch = make_dataloader(config, tokenizer).next_batch()
    texts = [
        tokenizer.decode(ids[mask.bool()])
        for ids, mask in zip(batch["input_ids"], batch["token_mask"], strict=True)
    ]
    return list(zip(texts[::2], texts[1::2], strict=True))


def test_built_in_pairs_are_seeded_and_ranked():
    rows = addition_preferences(6, seed=3)
    assert rows == addition_preferences(6, seed=3)
    assert rows != addition_preferences(6, seed=4)
    for index, row in enumerate(rows):
        ranks = [c["rank"] for c in row["completions"]]
        assert ranks == ([1, 0] if index % 2 else [0, 1])  # the preferred one is not always first
    assert carry_mistake(27, 15) == 32 and carry_mistake(12, 13) == 35


def test_batches_interleave_chosen_and_rejected(tiny_model_dir, tokenizer):
    config = dpo_config(tiny_model_dir)
    batch = make_dataloader(config, tokenizer).next_batch()
    assert batch.size == 2 * config.policy.train_global_batch_size
    assert set(batch) == {"input_ids", "input_lengths", "token_mask", "sample_mask"}
    for chosen, rejected in decoded_pairs(config, tokenizer):
        # the prompt is not trained on: only the completion turn is in token_mask
        assert "What is" not in chosen and "\\boxed{" in chosen and "\\boxed{" in rejected
        assert chosen != rejected
    # the loss takes the pairs apart as the collation put them together
    chosen, rejected = PreferenceLossFn.split_output_tensor(batch["input_ids"])
    assert chosen.shape[0] == rejected.shape[0] == config.policy.train_global_batch_size
    sets = validation_batches(config, tokenizer)
    assert list(sets) == ["default"]  # data.validation's set, by NeMo RL's name
    validation = list(sets["default"])
    assert len(validation) == config.dpo.val_batches
    assert validation[0].size == 2 * config.dpo.val_global_batch_size


def test_local_rows_of_both_formats(tiny_model_dir, tokenizer, tmp_path):
    binary = tmp_path / "binary.jsonl"
    rows = [
        {"question": f"Say {n}.", "good": f"{n}", "bad": f"not {n}", "source": "x"}
        for n in range(8)
    ]
    binary.write_text("".join(json.dumps(row) + "\n" for row in rows))
    keys = ("prompt_key=question", "chosen_key=good", "rejected_key=bad")
    config = dpo_config(tiny_model_dir, *local_train("BinaryPreferenceDataset", binary, *keys))
    pairs = decoded_pairs(config, tokenizer)
    assert {(c.split("\n")[1], r.split("\n")[1]) for c, r in pairs} == {
        (f"{n}<|im_end|>", f"not {n}<|im_end|>") for n in range(8)
    }
    ranked = tmp_path / "ranked.parquet"
    context = [{"role": "user", "content": "Pick one."}]
    table = [
        {
            "context": context,
            "completions": [
                {"rank": 2, "completion": [{"role": "assistant", "content": f"worse {n}"}]},
                {"rank": 1, "completion": [{"role": "assistant", "content": f"better {n}"}]},
            ],
        }
        for n in range(8)
    ]
    pq.write_table(pa.Table.from_pylist(table), ranked)
    config = dpo_config(tiny_model_dir, *local_train("PreferenceDataset", ranked))
    assert all("better" in c and "worse" in r for c, r in decoded_pairs(config, tokenizer))


def test_an_overlong_pair_is_kept_but_not_trained_on(tiny_model_dir, tokenizer, tmp_path):
    path = tmp_path / "long.jsonl"
    rows = [{"prompt": "Hi.", "chosen": "ok", "rejected": "no"}] * 7
    rows.append({"prompt": "Hi.", "chosen": "word " * 200, "rejected": "no"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = dpo_config(
        tiny_model_dir, *local_train("BinaryPreferenceDataset", path), "data.shuffle=false"
    )
    batch = make_dataloader(config, tokenizer).next_batch()
    assert batch["sample_mask"].tolist() == [1.0] * 14 + [0.0, 0.0]  # both halves of the pair
    assert batch["input_ids"].shape[1] <= config.policy.max_total_sequence_length


def check(tiny_model_dir, *overrides: str) -> None:
    check_run_config(
        DPOMasterConfig,
        str(DPO_CONFIG),
        [f"policy.model_name={tiny_model_dir}", *overrides],
        data_setup,
    )


def test_bad_rows_and_paths_are_refused_before_any_work(tiny_model_dir, tmp_path):
    missing = tmp_path / "absent.jsonl"
    with pytest.raises(FileNotFoundError, match=f"dataset path {missing} does not exist"):
        check(tiny_model_dir, *local_train("BinaryPreferenceDataset", missing))
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        '{"prompt": "a?", "chosen": "x", "rejected": "y"}\n{"prompt": "b?", "chosen": "x"}\n'
    )
    with pytest.raises(
        DatasetRowError, match=r"rows.jsonl: row 1 has no column 'rejected' \(data.rejected_key\)"
    ):
        check(tiny_model_dir, *local_train("BinaryPreferenceDataset", rows))
    rows.write_text('{"prompt": "a?", "chosen": " ", "rejected": "y"}\n')
    with pytest.raises(DatasetRowError, match=r"row 0 is empty 'chosen' \(data.chosen_key\)"):
        check(tiny_model_dir, *local_train("BinaryPreferenceDataset", rows))
    tie = {
        "context": [{"role": "user", "content": "a?"}],
        "completions": [
            {"rank": 0, "completion": [{"role": "assistant", "content": "x"}]},
            {"rank": 0, "completion": [{"role": "assistant", "content": "y"}]},
        ],
    }
    rows.write_text(json.dumps(tie) + "\n")
    with pytest.raises(DatasetRowError, match=r"rows.jsonl: row 0: both completions have rank 0"):
        check(tiny_model_dir, *local_train("PreferenceDataset", rows))
    rows.write_text(json.dumps({**tie, "completions": tie["completions"][:1]}) + "\n")
    with pytest.raises(DatasetRowError, match=r"row 0: 'completions' must hold exactly two"):
        check(tiny_model_dir, *local_train("PreferenceDataset", rows))


def test_what_dpo_cannot_train_on_is_refused_by_key(tiny_model_dir):
    with pytest.raises(ConfigError, match=r"data.train\[0\].processor: dpo trains on preference"):
        dpo_config(tiny_model_dir, "data.train.dataset_name=addition_sft", *NO_VALIDATION)
    with pytest.raises(ConfigError, match="no data.validation"):
        dpo_config(tiny_model_dir, "data.validation=null")
    with pytest.raises(ConfigError, match=r"policy.sequence_packing.enabled: dpo needs each pair"):
        dpo_config(tiny_model_dir, "policy.sequence_packing.enabled=true")
    with pytest.raises(ConfigError, match="prompt_key names a column of 'BinaryPreferenceDataset'"):
        dpo_config(tiny_model_dir, "data.default.prompt_key=question")


def test_every_sequence_of_a_pair_is_scored_from_the_same_prompt(tiny_model_dir, tokenizer):
    config = dpo_config(tiny_model_dir)
    batch = make_dataloader(config, tokenizer).next_batch()
    prompt = batch["input_ids"] * (1 - batch["token_mask"]).long()
    lengths = (batch["token_mask"].argmax(-1)).tolist()
    for pair in range(0, batch.size, 2):
        start = lengths[pair]
        assert start == lengths[pair + 1]
        assert torch.equal(prompt[pair, :start], prompt[pair + 1, :start])


def test_each_preference_algorithm_trains_its_own_kind_of_model(tiny_model_dir):
    with pytest.raises(
        ConfigError, match=r"reward_model_cfg.enabled=True: a dpo run trains a language"
    ):
        dpo_config(tiny_model_dir, "++policy.reward_model_cfg.enabled=true")
    rm_config = ROOT / "examples" / "configs" / "rm_tiny.yaml"

    def rm(*overrides: str) -> RMMasterConfig:
        return load_master_config(
            str(rm_config), [f"policy.model_name={tiny_model_dir}", *overrides], RMMasterConfig
        )

    assert rm().rm.max_num_steps == -1  # NeMo RL's "one epoch"
    with pytest.raises(ConfigError, match=r"enabled=False: a rm run trains a scalar-head reward"):
        rm("policy.reward_model_cfg.enabled=false")
    with pytest.raises(ConfigError, match="max_num_steps: 0 trains nothing"):
        rm("rm.max_num_steps=0")
    with pytest.raises(ConfigError, match="reward_model_type"):
        rm("policy.reward_model_cfg.reward_model_type=regression")


def ranked_rows(path: Path, word: str, count: int) -> Path:
    """``count`` rows of NeMo RL's PreferenceDataset format: context and ranked completions."""
    rows = [
        {
            "context": [{"role": "user", "content": f"Say {word} {n}."}],
            "completions": [
                {"rank": 1, "completion": [{"role": "assistant", "content": f"no {n}"}]},
                {"rank": 0, "completion": [{"role": "assistant", "content": f"{word} {n}"}]},
            ],
        }
        for n in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


PREFERENCE_RUNS = {
    "dpo": (DPO_CONFIG, DPOMasterConfig, dpo.VALIDATION_METRICS),
    "rm": (RM_CONFIG, RMMasterConfig, rm.VALIDATION_METRICS),
}


def loss_of(config) -> DPOLossFn | PreferenceLossFn:
    return PreferenceLossFn() if isinstance(config, RMMasterConfig) else DPOLossFn(config.dpo)


def trained_once(config, tokenizer):
    """The run's policy after one step (at its start every pair scores alike: log 2)."""
    reference = isinstance(config, DPOMasterConfig)
    policy = make_policy(config.policy, tokenizer=tokenizer, init_reference_model=reference)
    batch = make_dataloader(config, tokenizer).next_batch()
    mbs = 2 * config.policy.train_micro_batch_size
    if reference:
        batch = dpo.with_reference_logprobs(policy, batch, mbs)
    train_policy(policy, batch, loss_of(config), config, 0, gbs=batch.size, mbs=mbs)
    return policy


def named_set_metrics(config, tokenizer, policy) -> dict[str, float]:
    sets = validation_batches(config, tokenizer)
    if isinstance(config, RMMasterConfig):
        return rm.reward_validation(policy, sets, loss_of(config), config)
    return dpo.validation_metrics(policy, sets, loss_of(config), config)


@pytest.mark.parametrize("algorithm", PREFERENCE_RUNS)
def test_each_named_validation_set_is_validated_under_its_own_name(
    algorithm, tiny_model_dir, tokenizer, tmp_path, monkeypatch
):
    """NeMo RL's val_data_paths: each file (relative: from the config's directory) is a
    validation set of PreferenceDataset rows, reported as validation-<name>_<metric>, in
    place of data.validation's "default" set."""
    base, master, metric_names = PREFERENCE_RUNS[algorithm]
    ranked_rows(tmp_path / "short.jsonl", "yes", 6)
    ranked_rows(tmp_path / "other.jsonl", "maybe so", 4)
    (tmp_path / "run.yaml").write_text(
        f"defaults: {base}\ndata:\n  val_data_paths:\n    short: short.jsonl\n"
        "    other: other.jsonl\n"
    )
    monkeypatch.chdir(ROOT)  # not the config's directory: the files resolve from the config
    config = load_master_config(
        str(tmp_path / "run.yaml"), [f"policy.model_name={tiny_model_dir}"], master
    )
    assert config.data.val_data_paths == {
        "short": str(tmp_path / "short.jsonl"),
        "other": str(tmp_path / "other.jsonl"),
    }
    sets = validation_batches(config, tokenizer)
    assert list(sets) == ["short", "other"]
    assert [[batch.size for batch in batches] for batches in sets.values()] == [[12], [8]]

    policy = trained_once(config, tokenizer)
    metrics = named_set_metrics(config, tokenizer, policy)
    assert set(metrics) == {
        f"validation-{name}_{metric}"
        for name in ("short", "other")
        for metric in (*metric_names, "num_valid_samples")
    }
    assert metrics["validation-short_num_valid_samples"] == 6
    assert metrics["validation-other_num_valid_samples"] == 4
    assert metrics["validation-short_loss"] != metrics["validation-other_loss"]
    # each set is scored on its own rows: alone, "short" scores the same
    alone = config.model_copy(
        update={
            "data": config.data.model_copy(
                update={"val_data_paths": {"short": str(tmp_path / "short.jsonl")}}
            )
        }
    )
    short = named_set_metrics(alone, tokenizer, policy)
    assert short == {key: value for key, value in metrics.items() if "-short_" in key}


def test_a_missing_or_bad_validation_file_is_refused_naming_its_key(tiny_model_dir, tmp_path):
    missing = tmp_path / "absent.jsonl"
    with pytest.raises(ConfigError, match=f"data.val_data_paths.held: {missing} does not exist"):
        check(tiny_model_dir, f"+data.val_data_paths.held={missing}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"context": [{"role": "user", "content": "a?"}]}) + "\n")
    with pytest.raises(DatasetRowError, match="bad.jsonl: row 0"):
        check(tiny_model_dir, f"+data.val_data_paths.held={bad}")


def test_named_validation_sets_replace_data_validation_as_in_nemo_rl(tiny_model_dir, tmp_path):
    """While val_data_paths names sets, data.validation is not read (NeMo RL's precedence):
    a dataset there that could not load is not refused, and the log says it is unread;
    the sets alone satisfy validation being on."""
    held = ranked_rows(tmp_path / "held.jsonl", "yes", 2)
    hub = "data.validation.dataset_name=HelpSteer3"
    with pytest.raises(UnsupportedConfigError, match="data.validation.0.dataset_name='HelpSteer3'"):
        check(tiny_model_dir, hub)
    config = check_run_config(
        DPOMasterConfig,
        str(DPO_CONFIG),
        [f"policy.model_name={tiny_model_dir}", hub, f"+data.val_data_paths.held={held}"],
        data_setup,
    )
    assert list(config.data.validation_sets()) == ["held"]
    assert any(note.startswith("data.validation: not read") for note in config_notes(config))
    config = dpo_config(tiny_model_dir, "data.validation=null", f"+data.val_data_paths.held={held}")
    assert config_notes(config) == []


@pytest.mark.parametrize(
    ("master", "name"),
    [(MasterConfig, "grpo_math_tiny.yaml"), (SFTMasterConfig, "sft_tiny.yaml")],
    ids=["grpo", "sft"],
)
def test_val_data_paths_is_refused_where_nemo_rl_does_not_read_it(master, name, tmp_path):
    """NeMo RL's GRPO and SFT read no val_data_paths (only its preference setup does)."""
    held = ranked_rows(tmp_path / "held.jsonl", "yes", 2)
    with pytest.raises(
        UnsupportedConfigError, match=r"data.val_data_paths=\{'held': .*only in DPO and reward"
    ):
        check_run_config(
            master, str(ROOT / "examples" / "configs" / name), [f"+data.val_data_paths.held={held}"]
        )
