"""Message-log helpers and chat templates: exact per-turn token accounting, clear errors."""

import pytest
import torch
from transformers import AutoTokenizer

from nemo_rl_core.data.chat_templates import (
    PLAIN_CHAT_TEMPLATE,
    ChatTemplateError,
    configure_chat_template,
)
from nemo_rl_core.data.interfaces import TaskDataSpec
from nemo_rl_core.data.llm_message_utils import (
    add_loss_mask_to_message_log,
    batched_message_log_to_flat_message,
    get_formatted_message_log,
    get_keys_from_message_log,
    message_log_to_flat_messages,
    message_logs_to_train_data,
)

CHAT = [
    {"role": "system", "content": "You are a helpful model."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "The answer is 5."},
]


@pytest.fixture
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _log(*lengths, role="user"):
    return [
        {"role": role, "content": "x", "token_ids": torch.arange(n) + 10 * i}
        for i, n in enumerate(lengths)
    ]


def test_flat_messages_concatenate_tensors_and_list_strings():
    flat = message_log_to_flat_messages(_log(2, 3))
    assert flat["token_ids"].tolist() == [0, 1, 10, 11, 12]
    assert flat["role"] == ["user", "user"]


def test_batched_flat_messages_pad_and_report_lengths():
    batch, lengths = batched_message_log_to_flat_message(
        [_log(2, 3), _log(1)], pad_value_dict={"token_ids": -1}, make_sequence_length_divisible_by=4
    )
    assert lengths.tolist() == [5, 1]
    assert batch["token_ids"].shape == (2, 8)
    assert batch["token_ids"][1].tolist() == [0] + [-1] * 7


def test_tensor_key_missing_from_some_turns_is_named():
    log = _log(2, 2)
    log[1]["generation_logprobs"] = torch.zeros(2)
    with pytest.raises(ValueError, match="'generation_logprobs' is missing from messages \\[0\\]"):
        message_log_to_flat_messages(log)
    assert get_keys_from_message_log(log, ["role"]) == [{"role": "user"}, {"role": "user"}]


def test_loss_mask_and_train_data_follow_roles():
    logs = [_log(2, role="user") + _log(3, role="assistant")]
    logs[0][1]["generation_logprobs"] = torch.tensor([-0.5, -1.0, -2.0])
    add_loss_mask_to_message_log(logs, roles_to_train_on=["assistant"])
    assert logs[0][0]["token_loss_mask"].tolist() == [False, False]
    train = message_logs_to_train_data(logs, pad_token_id=0)
    assert train["input_lengths"].tolist() == [5]
    assert train["token_mask"].tolist() == [[0, 0, 1, 1, 1]]
    assert train["generation_logprobs"].tolist() == [[0, 0, -0.5, -1.0, -2.0]]
    add_loss_mask_to_message_log(logs, only_unmask_final=True)
    assert logs[0][0]["token_loss_mask"].sum() == 0 and logs[0][1]["token_loss_mask"].all()


@pytest.mark.parametrize("template", ["default", None])
def test_formatted_turns_concatenate_to_the_templated_conversation(tokenizer, template):
    configure_chat_template(tokenizer, template)
    formatted = get_formatted_message_log(CHAT, tokenizer, add_bos_token=False, add_eos_token=False)
    text = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert "".join(m["content"] for m in formatted) == text
    flat = torch.cat([m["token_ids"] for m in formatted]).tolist()
    assert flat == tokenizer(text, add_special_tokens=False)["input_ids"]
    if template is None:
        assert tokenizer.chat_template == PLAIN_CHAT_TEMPLATE
        assert text == "You are a helpful model.\n\nWhat is 2 + 3?The answer is 5."


def test_task_prompt_and_system_prompt_are_applied(tokenizer, tmp_path):
    (tmp_path / "p.txt").write_text("Q: {} A:")
    (tmp_path / "s.txt").write_text("Be brief.")
    spec = TaskDataSpec("math", tmp_path / "p.txt", tmp_path / "s.txt")
    formatted = get_formatted_message_log(
        [{"role": "user", "content": "1+1?"}], tokenizer, spec, add_generation_prompt=True
    )
    assert [m["role"] for m in formatted] == ["system", "user"]
    assert "Q: 1+1? A:" in formatted[1]["content"]
    assert formatted[1]["content"].endswith("<|im_start|>assistant\n")


def test_prompt_file_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.prompt_file"):
        TaskDataSpec("math", tmp_path / "missing.txt")
    (tmp_path / "p.txt").write_text("no placeholder")
    with pytest.raises(ValueError, match="placeholder"):
        TaskDataSpec("math", tmp_path / "p.txt")


def test_malformed_chat_template_names_the_key(tokenizer, tmp_path):
    with pytest.raises(ChatTemplateError, match="policy.tokenizer.chat_template: malformed"):
        configure_chat_template(tokenizer, "{% for m in messages %}{{ m['content'] }}")
    with pytest.raises(ChatTemplateError, match="my.key: chat template fails to render"):
        configure_chat_template(tokenizer, "{{ messages[0]['content'] + 1 }}", key="my.key")
    with pytest.raises(ChatTemplateError, match="does not exist"):
        configure_chat_template(tokenizer, str(tmp_path / "missing.jinja"))
