"""MathEnvironment: math-verify answer equivalence, time limits and worker failures."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from nemo_rl_core.algorithms.grpo_config import load_master_config
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.choice_answers import verify_multilingual_choice
from nemo_rl_core.environments.math_environment import MathEnvConfig, MathEnvironment
from nemo_rl_core.utils.key_support import check_support

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"

# (model response, ground truth, expected reward)
ANSWER_TABLE = [
    ("The answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),
    ("\\boxed{3}", "3.0", 1.0),
    ("\\boxed{3.0}", "3", 1.0),
    ("So we get \\boxed{42}.", "42", 1.0),
    ("\\boxed{41}", "42", 0.0),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", 1.0),
    ("\\boxed{0.75}", "3/4", 1.0),
    ("\\boxed{\\frac{1}{3}}", "0.5", 0.0),
    ("The total is $12$.", "12", 1.0),
    ("The total is $13$.", "12", 0.0),
    ("\\boxed{-7}", "-7", 1.0),
    ("\\boxed{7}", "-7", 0.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{10^3}", "1000", 1.0),
    ("\\boxed{2^{10}}", "1024", 1.0),
    ("\\boxed{\\sqrt{4}}", "2", 1.0),
    ("\\boxed{\\sqrt{2}}", "1.41", 0.0),
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}", 1.0),
    ("\\boxed{\\pi}", "\\pi", 1.0),
    ("\\boxed{3.14}", "\\pi", 0.0),
    ("\\boxed{x + 1}", "1 + x", 1.0),
    ("\\boxed{x^2 - 1}", "(x-1)(x+1)", 1.0),
    ("\\boxed{x^2 + 1}", "(x-1)(x+1)", 0.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),
    ("\\boxed{5\\,\\text{cm}}", "5 cm", 1.0),
    ("\\boxed{6 \\text{ cm}}", "5", 0.0),
    # NeMo RL runs math-verify on antlr 4.9.3 (Hydra's pin, as here), whose LaTeX grammar
    # does not read ``\%``: a percent answer is not matched to the bare number there either.
    ("\\boxed{50\\%}", "50", 0.0),
    ("\\boxed{25\\%}", "50", 0.0),
    ("\\boxed{\\$18}", "18", 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),
    ("\\boxed{(2, 1)}", "(1,2)", 0.0),
    ("\\boxed{[0, 1]}", "[0,1]", 1.0),
    ("\\boxed{x = 3}", "3", 1.0),
    ("\\boxed{\\frac{6}{8}}", "\\frac{3}{4}", 1.0),
    ("\\boxed{1.5}", "\\frac{3}{2}", 1.0),
    ("\\boxed{1.49}", "\\frac{3}{2}", 0.0),
    ("\\boxed{100}", "100.00", 1.0),
    ("\\boxed{0}", "0", 1.0),
    ("\\boxed{0}", "1", 0.0),
    ("I do not know.", "7", 0.0),
    ("", "7", 0.0),
    ("First 3, then \\boxed{8}", "8", 1.0),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", 1.0),
    ("\\boxed{\\sin(\\pi/6)}", "\\frac{1}{2}", 1.0),
]
HANG = "\\boxed{9^{9^{9}}}"  # sympy computes a 370-million-digit integer: minutes


def _log(response: str) -> list[dict]:
    return [
        {"role": "user", "content": "Solve it."},
        {"role": "assistant", "content": response},
    ]


@pytest.fixture(scope="module")
def env():
    environment = MathEnvironment({"num_workers": 2, "timeout_seconds": 1.5})
    yield environment
    environment.shutdown()


def test_answer_table_has_enough_pairs():
    assert len(ANSWER_TABLE) >= 40
    assert {reward for *_, reward in ANSWER_TABLE} == {0.0, 1.0}


def test_answer_table(env):
    result = env.step(
        [_log(response) for response, _, _ in ANSWER_TABLE],
        [{"ground_truth": truth} for _, truth, _ in ANSWER_TABLE],
    )
    got = result.rewards.tolist()
    wrong = [
        (response, truth, expected, g)
        for (response, truth, expected), g in zip(ANSWER_TABLE, got, strict=True)
        if g != expected
    ]
    assert not wrong, wrong
    assert result.terminateds.all()
    assert result.answers[0] is not None
    assert result.metadata[0]["reward_reason"] == "correct"
    assert result.metadata[5]["reward_reason"] == "wrong answer"


def test_hanging_sample_times_out_with_zero_reward(env):
    start = time.monotonic()
    result = env.step(
        [_log(HANG), _log("\\boxed{2}")], [{"ground_truth": "1"}, {"ground_truth": "2"}]
    )
    assert time.monotonic() - start < 20
    assert result.rewards.tolist() == [0.0, 1.0]
    assert result.metadata[0]["reward_reason"].startswith("timeout")
    _, metrics = env.global_post_process_and_metrics(
        BatchedDataDict({"rewards": result.rewards.tolist()})
    )
    assert metrics["num_verify_timeout"] == 1
    # the pool replaced the killed worker and still answers
    again = env.step([_log("\\boxed{4}")], [{"ground_truth": "4"}])
    assert again.rewards.tolist() == [1.0]


def test_checker_error_gives_zero_reward_with_reason(env):
    result = env.step([_log("\\boxed{4}")], [{"ground_truth": ""}])
    assert result.rewards.tolist() == [0.0]
    assert "no parsable answer" in result.metadata[0]["reward_reason"]
    _, metrics = env.global_post_process_and_metrics(BatchedDataDict({"rewards": [0.0]}))
    assert metrics["num_verify_error"] == 1


def test_dead_worker_gives_zero_reward_and_is_replaced():
    env = MathEnvironment(MathEnvConfig(num_workers=1, timeout_seconds=60))
    try:
        victim = env._pool.pids[0]
        threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
        result = env.step([_log(HANG)], [{"ground_truth": "1"}])
        assert result.rewards.tolist() == [0.0]
        assert result.metadata[0]["reward_reason"].startswith("died")
        assert env._pool.pids[0] != victim
        assert env.step([_log("\\boxed{3}")], [{"ground_truth": "3"}]).rewards.tolist() == [1.0]
        _, metrics = env.global_post_process_and_metrics(BatchedDataDict({"rewards": [0.0, 1.0]}))
        assert metrics["num_verify_died"] == 1
    finally:
        env.shutdown()


def test_missing_ground_truth_names_the_sample(env):
    with pytest.raises(KeyError, match="sample 0: metadata has no 'ground_truth'"):
        env.step([_log("\\boxed{1}")], [{"answer": "1"}])


def test_unknown_config_key_is_named():
    with pytest.raises(ValueError, match="num_worker"):
        MathEnvConfig.model_validate({"num_worker": 2})


def test_english_multichoice_reads_the_answer_letter():
    environment = MathEnvironment({"num_workers": 1, "verifier_type": "english_multichoice"})
    try:
        responses = [
            "The capital is Paris.\nAnswer: C",
            "**Answer: $\\boxed{C}$**",
            "answer:b",
            "Answer: B because C is wrong",
            "I think it is C.",
        ]
        result = environment.step(
            [_log(response) for response in responses], [{"ground_truth": "C"}] * len(responses)
        )
    finally:
        environment.shutdown()
    assert result.rewards.tolist() == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert result.answers == ["C", "C", "b", "B", None]


# (response, ground truth, reward, extracted letter) for ``multilingual_multichoice``
MULTILINGUAL_TABLE = [
    ("\n答案: C", "C", 1.0, "C"),  # NeMo RL's own case
    ("所以选 C。\n答案：Ｃ", "C", 1.0, "C"),  # full-width colon and letter
    ("答え：Ｂ", "B", 1.0, "B"),
    ("الإجابة: ج", "C", 1.0, "C"),  # Arabic jim is C
    ("الجواب النهائي: د", "D", 1.0, "D"),
    ("উত্তরঃ ড", "C", 1.0, "C"),  # Bengali, visarga as the colon
    ("उत्तर: A", "A", 1.0, "A"),  # Hindi
    ("정답: D", "D", 1.0, "D"),
    ("Réponse : B", "B", 1.0, "B"),
    ("Ìdáhùn: A", "A", 1.0, "A"),
    ("**Respuesta: $\\boxed{C}$**", "C", 1.0, "C"),
    ("Antwort: B", "C", 0.0, "B"),  # wrong letter
    ("الإجابة: ب", "C", 0.0, "B"),
    ("Ich glaube, es ist C.", "C", 0.0, None),  # no answer prefix
    ("Answer: E", "E", 0.0, None),  # only A-D are choices here
    ("answer: c", "C", 0.0, "c"),  # a lower-case letter is not the choice, as in NeMo RL
    ("答案：C\nAnswer: B", "C", 0.0, "B"),  # the earlier prefix in the list wins
]


@pytest.mark.parametrize(("response", "ground_truth", "reward", "letter"), MULTILINGUAL_TABLE)
def test_multilingual_multichoice_reads_the_letter_in_any_language(
    response, ground_truth, reward, letter
):
    assert verify_multilingual_choice((response, ground_truth)) == (reward, letter)


def test_multilingual_multichoice_scores_through_the_environment():
    environment = MathEnvironment({"num_workers": 1, "verifier_type": "multilingual_multichoice"})
    try:
        responses = ["答案: C", "الإجابة: ب", "Antwort: D", "No idea."]
        result = environment.step(
            [_log(response) for response in responses],
            [{"ground_truth": truth} for truth in ("C", "B", "B", "B")],
        )
    finally:
        environment.shutdown()
    assert result.rewards.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert result.answers == ["C", "B", "D", None]


def test_dapo_math_verify_reads_the_answer_line_by_string_match():
    """``math_verify_impl: dapo_math_verify``: the last "Answer:" line, normalised, must
    equal the normalised ground truth; a box alone is no answer, and there is no algebra."""
    environment = MathEnvironment({"num_workers": 1, "math_verify_impl": "dapo_math_verify"})
    try:
        responses = ["So 6 + 6 = 12.\nAnswer: 12 dollars", "\\boxed{12}", "Answer: 12.0"]
        result = environment.step(
            [_log(response) for response in responses], [{"ground_truth": "12"}] * 3
        )
    finally:
        environment.shutdown()
    assert result.rewards.tolist() == [1.0, 0.0, 0.0]
    assert result.answers == ["12", "[INVALID]", "12.0"]


def test_multilingual_multichoice_passes_the_support_check():
    """NeMo RL's MMLU and GPQA eval configs set it; it must not be refused."""
    override = "env.math.verifier_type=multilingual_multichoice"
    config = load_master_config(str(CONFIGS / "grpo_math_tiny.yaml"), [override])
    check_support(config)
