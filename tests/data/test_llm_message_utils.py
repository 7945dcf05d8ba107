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
    get_first_index_that_differs,
    get_formatted_message_log,
    get_keys_from_message_log,
    message_log_to_flat_messages,
    message_logs_to_train_data,
)
from nemo_rl_core.data.multimodal_utils import PackedTensor

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
    assert message_log_to_flat_messages([]) == {}


def test_flat_messages_keep_what_the_turns_have():
    """A key on some turns only (logprobs of generated turns) collects those turns."""
    log = _log(2, 2)
    log[1]["generation_logprobs"] = torch.tensor([-0.5, -1.0])
    log[1]["experts"] = torch.arange(2 * 3 * 4).reshape(2, 3, 4)
    flat = message_log_to_flat_messages(log)
    assert flat["generation_logprobs"].tolist() == [-0.5, -1.0]
    assert flat["experts"].shape == (2, 3, 4)  # trailing dims are not flattened
    assert get_keys_from_message_log(log, ["role", "nope"]) == [{"role": "user"}] * 2
    log[0]["experts"] = torch.zeros(2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="key='experts' must have same number of dimensions"):
        message_log_to_flat_messages(log)


def test_batched_flat_messages_pad_per_key_and_report_lengths():
    logs = [_log(2, 3), _log(1)]
    logs[0][1]["generation_logprobs"] = torch.tensor([-1.0, -2.0, -3.0])
    batch, lengths = batched_message_log_to_flat_message(
        logs,
        pad_value_dict={"token_ids": -1, "generation_logprobs": 7.0},
        make_sequence_length_divisible_by=4,
    )
    assert lengths.dtype == torch.int32 and lengths.tolist() == [5, 1]
    assert batch["token_ids"].shape == (2, 8)
    assert batch["token_ids"][1].tolist() == [0] + [-1] * 7
    # sample 1 has no logprobs at all: only padding; sample 0's sit at the start of its row
    assert batch["generation_logprobs"].tolist() == [[-1, -2, -3] + [7.0] * 5, [7.0] * 8]
    assert batch["role"] == [["user", "user"], ["user"]]


def test_batched_flat_messages_keep_trailing_dims_aligned_with_tokens():
    def routes(first, n):
        return torch.arange(first, first + n).view(n, 1, 1).expand(n, 2, 3)

    logs = [
        [{"token_ids": torch.tensor([1, 2]), "routes": routes(10, 2)}],
        [
            {"token_ids": torch.tensor([3]), "routes": routes(20, 1)},
            {"token_ids": torch.tensor([4, 5]), "routes": routes(30, 2)},
        ],
    ]
    batch, lengths = batched_message_log_to_flat_message(logs, make_sequence_length_divisible_by=5)
    assert batch["routes"].shape == (2, 5, 2, 3)
    assert batch["routes"][:, :, 0, 0].tolist() == [[10, 11, 0, 0, 0], [20, 30, 31, 0, 0]]
    assert lengths.tolist() == [2, 3]


def test_batched_flat_messages_refuse_mixed_dtypes_and_devices():
    mixed = [[{"token_ids": torch.tensor([1, 2])}], [{"token_ids": torch.tensor([1.0])}]]
    with pytest.raises(RuntimeError, match="expected consistent types for key='token_ids'"):
        batched_message_log_to_flat_message(mixed)
    devices = [
        [{"token_ids": torch.tensor([1])}],
        [{"token_ids": torch.ones(2, dtype=torch.long, device="meta")}],
    ]
    with pytest.raises(RuntimeError, match="expected tensors on the same device"):
        batched_message_log_to_flat_message(devices)
    with pytest.raises(ValueError, match="make_sequence_length_divisible_by must be >= 1"):
        batched_message_log_to_flat_message(_log(1), make_sequence_length_divisible_by=0)


def test_batched_flat_messages_without_tensors_or_samples():
    batch, lengths = batched_message_log_to_flat_message([[{"text": "a"}], [{"text": "b"}]])
    assert batch["text"] == ["a", "b"] and lengths.numel() == 0
    batch, lengths = batched_message_log_to_flat_message([])
    assert len(batch) == 0 and lengths.numel() == 0


def test_packed_images_pack_per_conversation():
    def image(n):
        return PackedTensor(torch.ones(n, 3, 2, 2), dim_to_pack=0)

    logs = [
        [{"token_ids": torch.tensor([1, 2]), "images": image(1)}],
        [
            {"token_ids": torch.tensor([3]), "images": image(2)},
            {"token_ids": torch.tensor([4]), "images": image(1)},
        ],
    ]
    assert message_log_to_flat_messages(logs[1])["images"].as_tensor().shape == (3, 3, 2, 2)
    batch, _ = batched_message_log_to_flat_message(logs)
    assert len(batch["images"]) == 2  # one packed tensor per conversation
    assert [t.shape[0] for t in batch["images"].tensors] == [1, 3]


def test_loss_mask_follows_roles_and_token_dtype():
    logs = [_log(2, role="system") + _log(3, role="assistant") + _log(1, role="user")]
    add_loss_mask_to_message_log(logs, roles_to_train_on=["Assistant", "SYSTEM"])
    masks = [m["token_loss_mask"] for m in logs[0]]
    assert [m.tolist() for m in masks] == [[1, 1], [1, 1, 1], [0]]
    assert all(m.dtype == torch.long for m in masks)  # as its token_ids
    add_loss_mask_to_message_log(logs)  # assistant only
    assert [m["token_loss_mask"].sum().item() for m in logs[0]] == [0, 3, 0]
    add_loss_mask_to_message_log(logs, only_unmask_final=True)
    assert [m["token_loss_mask"].sum().item() for m in logs[0]] == [0, 0, 1]


def test_train_data_fills_what_the_prompt_turns_lack():
    logs = [_log(2, role="user") + _log(3, role="assistant")]
    logs[0][1]["generation_logprobs"] = torch.tensor([-0.5, -1.0, -2.0])
    train = message_logs_to_train_data(logs, pad_token_id=0)
    assert train["input_lengths"].tolist() == [5]
    assert train["token_mask"].tolist() == [[0, 0, 1, 1, 1]]
    assert train["generation_logprobs"].tolist() == [[0, 0, -0.5, -1.0, -2.0]]


def test_first_index_that_differs():
    assert get_first_index_that_differs("abc", "abd") == 2
    assert get_first_index_that_differs("ab", "abcd") == 2
    assert get_first_index_that_differs("abcd", "ab") == 2
    assert get_first_index_that_differs("", "x") == 0


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
        assert text == "You are a helpful model.What is 2 + 3?The answer is 5."  # NeMo RL's


def test_generation_prompt_rides_on_user_turns(tokenizer):
    formatted = get_formatted_message_log(
        CHAT, tokenizer, add_bos_token=False, add_generation_prompt=True
    )
    contents = [m["content"] for m in formatted]
    assert contents[1] == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    assert contents[2] == "The answer is 5.<|im_end|>\n"  # EOS already there: none added
    prompt_only = get_formatted_message_log(CHAT[:2], tokenizer, None, False, False)
    assert prompt_only[-1]["content"].endswith("What is 2 + 3?<|im_end|>\n")


def test_eos_is_added_to_the_last_turn_when_the_template_has_none(tokenizer):
    configure_chat_template(tokenizer, None)  # plain: no end-of-turn markers
    with pytest.warns(UserWarning, match="add_bos_token is set but the tokenizer has no such"):
        formatted = get_formatted_message_log(CHAT, tokenizer)
    assert formatted[-1]["content"] == "The answer is 5.<|im_end|>"
    assert formatted[0]["content"] == "You are a helpful model."  # no BOS token to add
    empty = get_formatted_message_log(
        [{"role": "user", "content": ""}], tokenizer, None, False, False
    )
    assert empty[0]["token_ids"].dtype == torch.int64 and empty[0]["token_ids"].numel() == 0


def test_task_prompt_formats_only_the_first_user_turn(tokenizer, tmp_path):
    (tmp_path / "p.txt").write_text("Q: {} A:")
    (tmp_path / "s.txt").write_text("Be brief.")
    spec = TaskDataSpec("math", tmp_path / "p.txt", tmp_path / "s.txt")
    log = [
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2+2?"},
    ]
    formatted = get_formatted_message_log(log, tokenizer, spec, False, add_generation_prompt=True)
    assert [m["role"] for m in formatted] == ["user", "assistant", "user"]  # no system turn
    assert "Q: 1+1? A:" in formatted[0]["content"]
    assert "Q: 2+2?" not in formatted[2]["content"]


def test_templates_that_rerender_earlier_turns_still_split(tokenizer):
    """A template that hides earlier assistant reasoning (as Qwen3's drops old <think>):
    each turn gets the text from where the renderings first differ."""
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' and not loop.last %}"
        "{{ m['content'].split('</think>')[-1] }}|{% else %}{{ m['content'] }}|{% endif %}"
        "{% endfor %}"
    )
    log = [
        {"role": "user", "content": "q1"},
        {"role": "assistant", "content": "<think>hm</think>a1"},
        {"role": "user", "content": "q2"},
    ]
    formatted = get_formatted_message_log(log, tokenizer, None, False, False)
    assert [m["content"] for m in formatted] == ["q1|", "<think>hm</think>a1|", "a1|q2|"]


def test_tools_reach_the_template_and_debug_prints_turns(tokenizer, capsys):
    tokenizer.chat_template = (
        "{% if tools %}tools={{ tools | map(attribute='name') | join(',') }};{% endif %}"
        "{% for m in messages %}{{ m['role'] }}:{{ m['content'] }};{% endfor %}"
    )
    tools = [{"name": "calculator"}, {"name": "search"}]
    formatted = get_formatted_message_log(
        CHAT[1:], tokenizer, None, False, False, tools=tools, debug=True
    )
    assert formatted[0]["content"] == "tools=calculator,search;user:What is 2 + 3?;"
    out = capsys.readouterr().out
    assert "DEBUG: Individual message turns" in out and "role=assistant" in out
    assert "DEBUG: Complete formatted conversation" in out


def test_multimodal_content_is_refused_by_name(tokenizer):
    log = [{"role": "user", "content": [{"type": "text", "text": "?"}, {"type": "image"}]}]
    with pytest.raises(ValueError, match="'image' content part"):
        get_formatted_message_log(log, tokenizer)
    tokenizer.chat_template = (
        "{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %};{% endfor %}"
    )
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    spec = TaskDataSpec("t")
    spec.prompt = "Q: {}"
    formatted = get_formatted_message_log(text_parts, tokenizer, spec, False, False)
    assert formatted[0]["content"] == [{"type": "text", "text": "Q: hi;"}]


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
