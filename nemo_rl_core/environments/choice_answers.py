"""Multiple-choice answers read from a response (NeMo RL's ``english_multichoice`` and
``multilingual_multichoice`` verifiers of the math environment).

Both read the same way: markdown and LaTeX wrappers are stripped from the response, then
a list of "answer prefix + letter" patterns is tried in order and the first that matches
anywhere gives the letter. English has one prefix and any Latin letter; multilingual has
the prefixes of the languages NeMo RL evaluates (MMLU translations, GPQA) and the choices
A-D written in Latin, Arabic, Bengali or full-width letters, read as the Latin letter.
"""

import re
from collections.abc import Sequence

# "Answer: C" anywhere in the response, any case, as NeMo RL's English multiple-choice check.
CHOICE_LINE = re.compile(r"(?i)answer\s*:[ \t]*([A-Z])")
# Markdown and LaTeX wrappers a model puts around its choice ("**Answer: $\boxed{B}$**").
CHOICE_WRAPPERS = (
    "**",
    "$\\boxed{",
    "}$",
    "\\$",
    "$\\text{",
    "$",
    "\\mathrm{",
    "\\{",
    "\\text",
    "\\(",
    "\\mathbf{",
    "{",
    "\\boxed",
)

# "Answer:" in the languages of NeMo RL's multilingual evaluations, as regex fragments. The
# order is NeMo RL's and it matters: the first prefix found anywhere wins, not the earliest
# one in the response.
ANSWER_PREFIXES = (
    r"Answer\s*:",
    r"Answer\s*:\u200b\u200b\u200b\u200b\u200b\u200b",  # zero-width spaces Korean output has
    r"উত্তর\s*:",  # Bengali
    r"उत्तर\s*:",  # Hindi
    r"উত্তরঃ",  # Bengali, with the visarga as its colon
    r"Antwort\s*:",
    r"답변\s*:",  # Korean
    r"정답\s*:",
    r"답\s*:",
    r"答案\s*：",  # Chinese, full-width colon
    r"答案\s*:",
    r"答\s*：",
    r"答\s*:",
    r"答复\s*：",
    r"答曰\s*：",
    r"الإجابة:",  # Arabic
    r"الجواب:",
    r"إجابة:",
    r"الإجابة النهائية:",
    r"الإجابة الصحيحة:",
    r"الإجابة الصحيحة هي:",
    r"الإجابة هي:",
    r"الجواب النهائي:",
    r"Respuesta\s*:",
    r"Risposta\s*:",
    r"答え\s*:",  # Japanese
    r"答え\s*：",
    r"回答\s*:",
    r"回答\s*：",
    r"解答\s*:",
    r"Jawaban\s*:",  # Indonesian
    r"Réponse\s*:",
    r"Resposta\s*:",
    r"Jibu\s*:",  # Swahili
    r"Idahun\s*:",  # Yoruba, with and without its tone marks
    r"Ìdáhùn\s*:",
    r"Idáhùn\s*:",
    "A\u0300m\u1ecd\u0300na\u0300\\s*:",  # combining accents
    r"Àdáhùn\s*:",
    "A\u0300nu\u0301go\u0323\\s*:",  # combining accents
    r"Àṣàyàn\s*:",
)
# Choices A-D as Arabic (alif to dal, the letters between them included, as NeMo RL's
# pattern has them), Bengali and full-width letters, besides Latin.
CHOICE_LETTER = "[A-D\u0623-\u062f\u0985\u09ac\u09a1\u09a2\uff21-\uff24]"
MULTILINGUAL_CHOICE_LINES = tuple(
    re.compile(f"(?i){prefix}[ \\t]*({CHOICE_LETTER})") for prefix in ANSWER_PREFIXES
)
# The non-Latin letters that stand for A, B, C and D: Arabic أ ب ج د, Bengali অ ব ড ঢ and
# full-width Ａ Ｂ Ｃ Ｄ.
LATIN_CHOICE = str.maketrans(
    "\u0623\u0628\u062c\u062f\u0985\u09ac\u09a1\u09a2\uff21\uff22\uff23\uff24",
    "ABCD" * 3,
)


def unwrapped(text: str) -> str:
    """``text`` without the markdown and LaTeX wrappers that hide a choice from the pattern."""
    for wrapper in CHOICE_WRAPPERS:
        text = text.replace(wrapper, "")
    return text


def read_choice(response: str, patterns: Sequence[re.Pattern[str]]) -> str | None:
    """The letter after the first of ``patterns`` (in order) found in the unwrapped
    ``response``, as a Latin letter; None when none is found."""
    text = unwrapped(response)
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return match.group(1).translate(LATIN_CHOICE)
    return None


def verify_english_choice(item: tuple[str, str]) -> tuple[float, str | None]:
    """Reward 1.0 when the first "Answer: X" of the response names the ground truth's letter
    (NeMo RL's ``english_multichoice`` verifier); the letter is the extracted answer."""
    response, ground_truth = item
    letter = read_choice(response, (CHOICE_LINE,))
    return (1.0 if letter == unwrapped(ground_truth) else 0.0), letter


def verify_multilingual_choice(item: tuple[str, str]) -> tuple[float, str | None]:
    """Reward 1.0 when the answer letter after a prefix of any language is the ground truth
    (NeMo RL's ``multilingual_multichoice`` verifier, which compares the ground truth as
    given, unlike the English one); the letter is the extracted answer."""
    response, ground_truth = item
    letter = read_choice(response, MULTILINGUAL_CHOICE_LINES)
    return (1.0 if letter == ground_truth else 0.0), letter
