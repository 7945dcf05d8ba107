"""NeMo RL's ``math_hf_data_processor``: chat rows to one templated user turn."""

import pytest
from transformers import AutoTokenizer

from nemo_rl_core.data.interfaces import TaskDataSpec
from nemo_rl_core.data.processors import math_hf_data_processor

ROW = {
    "messages": [
        {"role": "user", "content": "What is 6 times 7?"},
        {"role": "assistant", "content": "42"},
    ],
    "task_name": "math",
}


@pytest.fixture
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_question_system_prompt_and_generation_prompt_make_one_user_turn(tokenizer, tmp_path):
    (tmp_path / "prompt.txt").write_text("Solve: {}")
    (tmp_path / "system.txt").write_text("Think step by step.")
    spec = TaskDataSpec("math", tmp_path / "prompt.txt", tmp_path / "system.txt")
    datum = math_hf_data_processor(ROW, spec, tokenizer, max_seq_length=256, idx=5)
    [turn] = datum["message_log"]
    assert turn["role"] == "user"
    assert turn["content"] == (
        "<|im_start|>system\nThink step by step.<|im_end|>\n"
        "<|im_start|>user\nSolve: What is 6 times 7?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert (
        turn["token_ids"].tolist()
        == tokenizer(turn["content"], add_special_tokens=False)["input_ids"]
    )
    assert datum["length"] == len(turn["token_ids"])
    assert datum["extra_env_info"] == {"ground_truth": "42"}
    assert (datum["loss_multiplier"], datum["idx"], datum["task_name"]) == (1.0, 5, "math")


def test_prompt_that_fills_the_sequence_is_cut_and_not_trained(tokenizer):
    full = math_hf_data_processor(ROW, TaskDataSpec("math"), tokenizer, 256, 0)["length"]
    datum = math_hf_data_processor(ROW, TaskDataSpec("math"), tokenizer, full, 0)
    assert datum["loss_multiplier"] == 0.0  # no room left to generate
    cut = math_hf_data_processor(ROW, TaskDataSpec("math"), tokenizer, 6, 0)
    assert cut["length"] == 6 and cut["loss_multiplier"] == 0.0


def test_row_without_the_answer_is_named(tokenizer):
    row = {"messages": ROW["messages"][:1], "task_name": "math"}
    with pytest.raises(ValueError, match="row 3: 'messages' needs the question and the reference"):
        math_hf_data_processor(row, TaskDataSpec("math"), tokenizer, 64, 3)
