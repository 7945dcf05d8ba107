"""Chat templates: the tokenizer's own, a plain one for base models, or one from config.

NeMo RL's ``tokenizer.chat_template`` key: absent or ``"default"`` keeps the tokenizer's
template; ``null`` selects the plain passthrough template (base models have no chat
format: the turns' contents, concatenated); any other string is a Jinja template or a
path to a ``.jinja`` file. A template is checked once when configured, so a malformed one
fails at setup naming its config key, not in the middle of a run.
"""

from pathlib import Path
from typing import Any

import jinja2

# NeMo RL's passthrough: the turns' contents concatenated, nothing added.
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"


class COMMON_CHAT_TEMPLATES:  # noqa: N801 - NeMo RL's name
    """NeMo RL's ready-made templates, for ``tokenizer.chat_template``."""

    # Each turn as a Llama-3 role header, its stripped content and <|eot_id|>; bos first.
    simple_role_header = (
        "{{ bos_token }}{% for message in messages %}"
        "{{ '<|start_header_id|>' ~ message['role'] ~ '<|end_header_id|>\n\n' }}"
        "{{ message['content'] | trim }}{{ '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    )
    passthrough_prompt_response = PLAIN_CHAT_TEMPLATE


_PROBE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u"},
    {"role": "assistant", "content": "a"},
]


class ChatTemplateError(ValueError):
    """A chat template that does not compile or does not render a plain conversation."""


def configure_chat_template(
    tokenizer: Any,
    chat_template: str | None = "default",
    key: str = "policy.tokenizer.chat_template",
) -> Any:
    """Set the template NeMo RL's way (see module doc), check it renders, return the tokenizer."""
    if chat_template is None:
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    elif chat_template != "default":
        path = Path(chat_template)
        is_file = chat_template.endswith(".jinja")
        if is_file and not path.is_file():
            raise ChatTemplateError(f"{key}: template file {chat_template} does not exist")
        tokenizer.chat_template = path.read_text() if is_file else chat_template
    elif not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = PLAIN_CHAT_TEMPLATE
    check_chat_template(tokenizer, key)
    return tokenizer


def check_chat_template(tokenizer: Any, key: str) -> None:
    """Render a probe conversation; raise ``ChatTemplateError`` naming ``key`` if it fails."""
    try:
        render_chat(tokenizer, _PROBE, add_generation_prompt=True)
    except jinja2.TemplateSyntaxError as err:
        raise ChatTemplateError(
            f"{key}: malformed chat template, line {err.lineno}: {err.message}"
        ) from err
    except (jinja2.TemplateError, KeyError, TypeError, ValueError) as err:
        raise ChatTemplateError(
            f"{key}: chat template fails to render a system/user/assistant conversation: "
            f"{type(err).__name__}: {err}"
        ) from err


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = False,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The conversation as text under the tokenizer's template (plain when it has none);
    ``tools`` (function definitions) are handed to templates that render them."""
    template = getattr(tokenizer, "chat_template", None) or PLAIN_CHAT_TEMPLATE
    extra = {} if tools is None else {"tools": tools}
    return tokenizer.apply_chat_template(
        messages,
        chat_template=template,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **extra,
    )
