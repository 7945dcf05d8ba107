"""NeMo RL's ``get_tokenizer``: a ``tokenizer:`` section made into the tokenizer the policy
loads, with NeMo RL's chat-template choices, and bad sections refused naming the key."""

from pathlib import Path

import pytest

from nemo_rl_core.algorithms.utils import get_tokenizer
from nemo_rl_core.data.chat_templates import COMMON_CHAT_TEMPLATES
from nemo_rl_core.models.policy.config import TokenizerConfig, TrainedModelConfig
from nemo_rl_core.models.policy.hf_loading import load_tokenizer

CHAT = [
    {"role": "system", "content": "Add the numbers."},
    {"role": "user", "content": " 2 + 3 = "},
    {"role": "assistant", "content": "5"},
]


def test_default_is_the_policys_tokenizer(tiny_model_dir: Path) -> None:
    """The same text and ids as the tokenizer a policy of that model loads."""
    ours = get_tokenizer({"name": str(tiny_model_dir)})
    section = TrainedModelConfig.model_construct(
        model_name=str(tiny_model_dir), tokenizer=TokenizerConfig()
    )
    policy = load_tokenizer(section)
    text = ours.apply_chat_template(CHAT, tokenize=False)
    assert "<|im_start|>system" in text  # the tiny model's own ChatML template
    assert text == policy.apply_chat_template(CHAT, tokenize=False)
    assert ours(text)["input_ids"] == policy(text)["input_ids"]
    assert ours.pad_token_id is not None


def test_null_template_concatenates_the_turns_as_nemo_rl_does(tiny_model_dir: Path) -> None:
    tokenizer = get_tokenizer({"name": str(tiny_model_dir), "chat_template": None})
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == "Add the numbers. 2 + 3 = 5"


def test_named_template_file_and_kwargs(tiny_model_dir: Path, tmp_path: Path) -> None:
    header = get_tokenizer(
        {"name": str(tiny_model_dir), "chat_template": COMMON_CHAT_TEMPLATES.simple_role_header}
    )
    text = header.apply_chat_template(CHAT[1:], tokenize=False, add_generation_prompt=True)
    bos = header.bos_token or ""
    assert text == (
        f"{bos}<|start_header_id|>user<|end_header_id|>\n\n2 + 3 =<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n5<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    template = tmp_path / "shout.jinja"
    template.write_text(
        "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}{{ suffix | default('') }}"
    )
    shout = get_tokenizer(
        {
            "name": str(tiny_model_dir),
            "chat_template": str(template),
            "chat_template_kwargs": {"suffix": "!"},
        }
    )
    assert shout.apply_chat_template(CHAT, tokenize=False) == "ADD THE NUMBERS. 2 + 3 = 5!"


@pytest.mark.parametrize(
    ("section", "says"),
    [
        ({"chat_template": None}, "tokenizer.name: missing"),
        ({"name": "x", "chat_templte": None}, "chat_templte"),
        ({"name": "x", "chat_template": "/nowhere/t.jinja"}, "does not exist"),
    ],
)
def test_a_bad_section_is_refused_naming_the_key(
    section: dict, says: str, tiny_model_dir: Path
) -> None:
    if section.get("name") == "x":
        section = {**section, "name": str(tiny_model_dir)}
    with pytest.raises(ValueError, match=says):
        get_tokenizer(section)


def test_a_multimodal_processor_is_refused(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="text LLMs only"):
        get_tokenizer({"name": str(tiny_model_dir)}, get_processor=True)
