"""Math answers checked with ``math-verify`` (NeMo RL's ``MathEnvironment``).

The model's answer is parsed for its answer (``\\boxed{}``, LaTeX, plain numbers and
expressions) and compared with the row's ``ground_truth`` symbolically, so ``\\frac{1}{2}``
matches ``0.5``. Checking runs in a pool of ``env.math.num_workers`` processes with a
per-sample time limit: sympy can hang on inputs like ``9^{9^{9}}``, and such a sample gets
reward 0 with the reason in its metadata instead of stalling the run.
``verifier_type: countdown`` (or ``CountdownEnvironment``) checks countdown expressions;
``english_multichoice`` and ``multilingual_multichoice`` read a choice letter after an
"Answer:" prefix (``choice_answers``);
``math_verify_impl: dapo_math_verify`` checks math answers by DAPO's rules instead
(``dapo_math_verifier``). ``MathMultiRewardEnvironment`` (``env.math_multi_reward``) gives
three rewards per response instead of one (GDPO's).
"""

from typing import Any, TypedDict

import torch

from nemo_rl_core.data.interfaces import LLMMessageLogType
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.config import MathEnvConfig, MathMultiRewardEnvConfig
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.environments.math_verifier import check_answer, warm_up
from nemo_rl_core.environments.metrics import reward_metrics
from nemo_rl_core.environments.multi_reward_checks import REWARD_COMPONENTS, check_multi_reward
from nemo_rl_core.environments.worker_pool import TimedProcessPool


class MathEnvironmentMetadata(TypedDict, total=False):
    ground_truth: str
    extracted_answer: str | None
    reward_reason: str  # why the reward is what it is (correct / wrong / timeout / error)


class MathEnvironment(EnvironmentInterface[MathEnvironmentMetadata]):
    """Single-turn: reward 1/0 for the final answer of the last assistant turn."""

    config_class = MathEnvConfig
    extracts_answers = True

    def __init__(self, cfg: MathEnvConfig | dict[str, Any] | None = None):
        self.cfg = (
            cfg
            if isinstance(cfg, self.config_class)
            else self.config_class.model_validate(cfg or {})
        )
        self._pool = self._start_checkers()
        self._failures = {"timeout": 0, "error": 0, "died": 0}

    def _start_checkers(self) -> TimedProcessPool:
        """The pool of ``num_workers`` processes that check answers."""
        warm_up()  # sympy's lazy imports happen once here; forked workers inherit them
        return TimedProcessPool(
            check_answer,
            self.cfg.num_workers,
            warmup_item={"verifier": "math", "response": "\\boxed{1}", "ground_truth": "1"},
        )

    def step(
        self,
        message_log_batch: list[LLMMessageLogType],
        metadata: list[MathEnvironmentMetadata],
        *args: Any,
        **kwargs: Any,
    ) -> EnvironmentReturn[MathEnvironmentMetadata]:
        responses = [
            "".join(m["content"] for m in log if m["role"] == "assistant")
            for log in message_log_batch
        ]
        for i, meta in enumerate(metadata):
            if "ground_truth" not in meta:
                raise KeyError(f"sample {i}: metadata has no 'ground_truth' (keys: {sorted(meta)})")
        items = [
            {
                "verifier": self.cfg.verifier_type,
                "math_verify_impl": self.cfg.math_verify_impl,
                "response": response,
                "ground_truth": str(meta["ground_truth"]),
                "numbers": meta.get("numbers"),
            }
            for response, meta in zip(responses, metadata, strict=True)
        ]
        outcomes = self._pool.map(items, self.cfg.timeout_seconds)
        rewards: list[Any] = []
        answers, observations = [], []
        new_metadata: list[MathEnvironmentMetadata] = []
        for meta, outcome in zip(metadata, outcomes, strict=True):
            if outcome.ok:
                reward, answer = outcome.value
                # a multi-reward environment's first reward is its correctness, as in NeMo RL
                correct = (reward if isinstance(reward, float) else reward[0]) == 1.0
                reason = "correct" if correct else "wrong answer"
            else:
                self._failures[outcome.kind] += 1
                reward, answer, correct = self._no_reward(), None, False
                reason = f"{outcome.kind}: {outcome.reason}"
            rewards.append(reward)
            answers.append(answer)
            new_metadata.append({**meta, "extracted_answer": answer, "reward_reason": reason})
            verdict = "correct" if correct else "incorrect"
            observations.append({"role": "environment", "content": f"Environment: {verdict}"})
        return EnvironmentReturn(
            observations=observations,
            metadata=new_metadata,
            next_stop_strings=[self.cfg.stop_strings] * len(rewards),
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.ones(len(rewards), dtype=torch.bool),
            answers=answers,
        )

    def _no_reward(self) -> Any:
        """The reward of a response whose check did not finish."""
        return 0.0

    def global_post_process_and_metrics(
        self, batch: BatchedDataDict
    ) -> tuple[BatchedDataDict, dict[str, Any]]:
        """Accuracy metrics, plus how many checks timed out, raised or lost their worker since
        the last call."""
        metrics = reward_metrics(batch)
        metrics.update({f"num_verify_{kind}": count for kind, count in self._failures.items()})
        self._failures = dict.fromkeys(self._failures, 0)
        return batch, metrics

    def shutdown(self) -> None:
        self._pool.shutdown()


class CountdownEnvironment(MathEnvironment):
    """``env.countdown``: the math environment with the countdown verifier (the boxed
    expression must reach ``ground_truth`` using only the sample's ``numbers``)."""

    def __init__(self, cfg: MathEnvConfig | dict[str, Any] | None = None):
        base = cfg if isinstance(cfg, MathEnvConfig) else MathEnvConfig.model_validate(cfg or {})
        super().__init__(base.model_copy(update={"verifier_type": "countdown"}))


class MathMultiRewardEnvironment(MathEnvironment):
    """NeMo RL's ``math_multi_reward``: three rewards per response, ``[B, 3]``
    (correct, integer, format: ``multi_reward_checks``), which the rollouts store as
    ``reward1..3`` (their sum is ``total_reward``) for GDPO to normalise one by one."""

    config_class = MathMultiRewardEnvConfig

    def _start_checkers(self) -> TimedProcessPool:
        return TimedProcessPool(
            check_multi_reward,
            self.cfg.num_workers,
            warmup_item={"response": "<answer>1</answer>", "ground_truth": "1"},
        )

    def _no_reward(self) -> Any:
        return (0.0,) * len(REWARD_COMPONENTS)
