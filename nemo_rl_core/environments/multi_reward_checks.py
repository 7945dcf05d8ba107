"""The three rewards of NeMo RL's multi-reward math environment (``math_multi_reward``), for
a response asked to think in ``<think>...</think>`` and then answer in ``<answer>...</answer>``
(NeMo RL's ``examples/prompts/gsm8k.txt``): the answer is the ground truth, it is an integer,
and the whole response has that form. Plain string checks, as NeMo RL's: ``12.0`` is not
``12``, ``-3`` is not an integer.
"""

import re

REWARD_COMPONENTS = ("correct", "integer", "format")
_FORM = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)


def tagged_answer(response: str) -> str:
    """What follows the last ``<answer>``, up to the ``</answer>`` after it, stripped (the
    whole response when it has no tags)."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def check_multi_reward(item: dict) -> tuple[tuple[float, float, float], str]:
    """``(correct, integer, format)`` rewards of ``item["response"]`` against
    ``item["ground_truth"]``, and the answer read (the worker pool's entry point)."""
    response = item["response"]
    answer = tagged_answer(response)
    well_formed = (
        _FORM.search(response) is not None
        and response.count("<answer>") == 1
        and response.count("</answer>") == 1
    )
    rewards = (float(answer == item["ground_truth"]), float(answer.isdigit()), float(well_formed))
    return rewards, answer
