"""SFT data: conversations from local JSONL/Parquet or the built-in additions, through
``sft_processor`` into the tensors ``NLLLossFn`` trains on; and what is refused."""

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from nemo_rl_core.algorithms.grpo import MasterConfig, load_master_config
from nemo_rl_core.algorithms.sft import (
    SFTMasterConfig,
    conversations_to_train_data,
    data_setup,
    validation_batches,
)
from nemo_rl_core.data.dataloader import StatefulDataLoader
from nemo_rl_core.data.datasets.builder import build_dataset
from nemo_rl_core.data.datasets.local_files import DatasetRowError, openai_rows
from nemo_rl_core.data.datasets.processed_dataset import rl_collate_fn
from nemo_rl_core.utils.config import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SFT_CONFIG = ROOT / "examples" / "configs" / "sft_tiny.yaml"
GRPO_CONFIG = ROOT / "examples" / "configs" / "grpo_math_tiny.yaml"
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def sft_config(tiny_model_dir, *overrides: str) -> SFTMasterConfig:
    config = load_master_config(
        str(SFT_CONFIG), [f"policy.model_name={tiny_model_dir}", *overrides], SFTMasterConfig
    )
    assert isinstance(config, SFTMasterConfig)
    return config


def local_train(path: Path) -> list[str]:
    return [
        "data.train.dataset_name=ResponseDataset",
        f"++data.train.data_path={path}",
        "++data.train.input_key=question",
        "++data.train.output_key=answer",
    ]


def train_data(config: SFTMasterConfig, tokenizer) -> tuple[list, dict]:
    dataset = build_dataset(config.data, tokenizer, setup=data_setup(config))
    datums = [dataset[i] for i in range(len(dataset))]
    batch = conversations_to_train_data(rl_collate_fn(datums), tokenizer, config)
    return datums, batch


def test_parquet_rows_of_both_formats_train_on_the_assistant_turns_only(
    tiny_model_dir, tokenizer, tmp_path
):
    path = tmp_path / "mixed.parquet"
    rows = [
        {"question": "What is 1 + 1?", "answer": "2", "messages": None},
        {"question": None, "answer": None, "messages": CHAT},
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    config = sft_config(
        tiny_model_dir, *local_train(path), "sft.val_at_start=false", "sft.val_period=0"
    )
    datums, batch = train_data(config, tokenizer)
    roles = [[m["role"] for m in d["message_log"]] for d in datums]
    assert roles == [["user", "assistant"], ["system", "user", "assistant"]]
    for row, datum in enumerate(datums):
        answer = datum["message_log"][-1]
        masked = batch["input_ids"][row][batch["token_mask"][row].bool()]
        assert masked.tolist() == answer["token_ids"].tolist()  # the answer turn, nothing else
        assert tokenizer.decode(answer["token_ids"]).rstrip("\n").endswith(tokenizer.eos_token)
    assert batch["sample_mask"].tolist() == [1.0, 1.0]


def test_only_unmask_final_and_overlong_conversations(tiny_model_dir, tokenizer, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"question": "What is 1 + 1?", "answer": "2"}\n'
        + '{"question": "'
        + "long " * 200
        + '", "answer": "x"}\n'
    )
    config = sft_config(
        tiny_model_dir,
        *local_train(path),
        "sft.val_at_start=false",
        "sft.val_period=0",
        "sft.only_unmask_final=true",
    )
    datums, batch = train_data(config, tokenizer)
    assert batch["sample_mask"].tolist() == [1.0, 0.0]  # cut to fit: never trained on
    assert batch["input_ids"].shape[1] < config.policy.max_total_sequence_length
    assert torch.equal(
        batch["token_mask"][0][batch["token_mask"][0].bool()],
        torch.ones(len(datums[0]["message_log"][-1]["token_ids"])),
    )


def test_validation_batches_follow_the_sft_keys(tiny_model_dir, tokenizer):
    config = sft_config(
        tiny_model_dir,
        "sft.val_global_batch_size=8",
        "sft.val_batches=3",
        "data.validation.num_samples=40",
    )
    sizes = [batch.size for batch in validation_batches(config, tokenizer)]
    assert sizes == [8, 8, 8]
    config = sft_config(
        tiny_model_dir,
        "sft.val_global_batch_size=16",
        "sft.val_batches=0",
        "data.validation.num_samples=40",
    )
    assert [batch.size for batch in validation_batches(config, tokenizer)] == [16, 16, 8]


def test_the_dataloader_shuffles_from_the_sft_seed(tiny_model_dir, tokenizer):
    def first_batch(seed: int) -> list:
        config = sft_config(tiny_model_dir, f"sft.seed={seed}")
        loader = StatefulDataLoader(
            build_dataset(config.data, tokenizer, setup=data_setup(config)),
            batch_size=4,
            shuffle=True,
            seed=config.sft.seed,
        )
        return loader.next_batch()["idx"]

    assert first_batch(1) == first_batch(1) != first_batch(2)


def test_refused_before_any_work(tiny_model_dir):
    with pytest.raises(
        ConfigError, match=r"data.train\[0\].processor: SFT trains on conversations"
    ):
        sft_config(tiny_model_dir, "data.default.processor=math_data_processor")
    with pytest.raises(ConfigError, match="there is no validation data"):
        sft_config(tiny_model_dir, "data.validation=null")
    with pytest.raises(ConfigError, match=r"data.train\[0\]: addition_sft makes SFT conversations"):
        load_master_config(str(GRPO_CONFIG), ["data.train.dataset_name=addition_sft"], MasterConfig)


def test_prompt_and_system_prompt_files_shape_the_conversation(tiny_model_dir, tokenizer, tmp_path):
    (tmp_path / "prompt.txt").write_text("Q: {}")
    (tmp_path / "system.txt").write_text("You add.")
    config = sft_config(
        tiny_model_dir,
        f"data.default.prompt_file={tmp_path / 'prompt.txt'}",
        f"data.default.system_prompt_file={tmp_path / 'system.txt'}",
    )
    datums, _ = train_data(config, tokenizer)
    system, user, assistant = datums[0]["message_log"]
    assert "You add." in system["content"]
    assert "Q: What is " in user["content"]
    assert "\\boxed{" in assistant["content"]


def test_openai_format_conversations_train_with_their_system_prompt_and_tools(
    tiny_model_dir, tokenizer, tmp_path
):
    """NeMo RL's openai_format: the conversation at chat_key, a system prompt put before
    it, the tools offered passed to the chat template."""
    tool_call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}}
    rows = [
        {"chat": CHAT[1:]},
        {
            "chat": [
                CHAT[1],
                {"role": "assistant", "content": "", "tool_calls": [tool_call]},
                {"role": "tool", "content": "5", "tool_call_id": "c1"},
                CHAT[2],
            ],
            "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}],
        },
    ]
    path = tmp_path / "chats.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    openai = [
        "data.train.dataset_name=openai_format",
        f"++data.train.data_path={path}",
        "++data.train.chat_key=chat",
        "++data.train.system_prompt=Be brief.",
        "sft.val_at_start=false",
        "sft.val_period=0",
    ]
    datums, batch = train_data(sft_config(tiny_model_dir, *openai), tokenizer)
    roles = [[m["role"] for m in d["message_log"]] for d in datums]
    assert roles == [
        ["system", "user", "assistant"],
        ["system", "user", "assistant", "tool", "assistant"],
    ]
    assert "Be brief." in datums[0]["message_log"][0]["content"]
    # a tool call's turn may carry no text (OpenAI writes null); the rows keep it as written
    [kept] = openai_rows([{"messages": [CHAT[1], rows[1]["chat"][1] | {"content": None}]}], "x")
    assert kept["messages"][1]["content"] is None and "tools" not in kept
    assert batch["sample_mask"].tolist() == [1.0, 1.0]

    path.write_text(json.dumps({"chat": [*CHAT[1:], CHAT[1]]}) + "\n")
    with pytest.raises(
        DatasetRowError, match="row 0: the conversation must end with the assistant"
    ):
        train_data(sft_config(tiny_model_dir, *openai), tokenizer)
    with pytest.raises(ConfigError, match="chat_key is a key of 'openai_format' datasets"):
        sft_config(tiny_model_dir, *local_train(path), "++data.train.chat_key=chat")
    with pytest.raises(
        ConfigError, match=r"data.train\[0\]: openai_format makes SFT conversations"
    ):
        load_master_config(str(GRPO_CONFIG), openai[:3], MasterConfig)
