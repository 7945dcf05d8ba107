"""Model-written Python run against test cases in a sandbox (``env.code``).

The last fenced code block of the model's answer runs once per test case, each run in a
fresh bubblewrap sandbox of ``code_sandbox`` (namespaces, seccomp, rlimits, a cgroup where
delegated; the environment refuses to start where that sandbox cannot be built). A test
case is ``{"input": stdin, "output": expected stdout}`` (compared after stripping trailing
whitespace per line) or ``{"assert": "assert f(2) == 4"}``, split by ``code_assertions``
so that the sandbox only computes the solution's values and this process compares them
with the expected ones. Expected outputs never enter the sandbox. Reward 1.0 when every
test passes; whatever the program does (hang, crash, early exit, escape attempt) fails
that sample only, and the reason is in its metadata.
"""

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from nemo_rl_core.data.interfaces import LLMMessageLogType
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.code_assertions import AssertTest, compile_assert_test
from nemo_rl_core.environments.code_sandbox import SandboxLimits, require_sandbox, run_sandboxed
from nemo_rl_core.environments.config import CodeEnvConfig
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.environments.metrics import reward_metrics

_CODE_BLOCK = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL)


class CodeEnvMetadata(TypedDict, total=False):
    tests: list[dict[str, str]]
    tests_passed: int
    reward_reason: str


def extract_code(response: str) -> str | None:
    """The last fenced code block of a response (an unclosed last fence counts)."""
    blocks = _CODE_BLOCK.findall(response + ("\n```" if response.count("```") % 2 else ""))
    return blocks[-1] if blocks else None


def _normalized(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


@dataclass(frozen=True)
class _StdoutTest:
    stdin: str
    expected: str


def _parse_tests(i: int, tests: object) -> list[_StdoutTest | AssertTest]:
    shape = (
        f"sample {i}: metadata 'tests' must be a non-empty list of "
        "{'input', 'output'} or {'assert'} cases"
    )
    if not isinstance(tests, list) or not tests:
        raise KeyError(shape)
    parsed: list[_StdoutTest | AssertTest] = []
    for j, test in enumerate(tests):
        if isinstance(test, dict) and isinstance(test.get("assert"), str):
            try:
                parsed.append(compile_assert_test(test["assert"]))
            except ValueError as error:
                raise ValueError(f"sample {i}, test {j}: the 'assert' test {error}") from None
        elif isinstance(test, dict) and "output" in test:
            parsed.append(_StdoutTest(test.get("input", ""), test["output"]))
        else:
            raise KeyError(shape)
    return parsed


def _check(code: str, test: _StdoutTest | AssertTest, limits: SandboxLimits) -> tuple[bool, str]:
    if isinstance(test, AssertTest):
        result = run_sandboxed(code, "", limits, probes=test.probes)
        if result.reason:
            tail = result.stderr.strip().splitlines()[-1:] or [""]
            return False, f"{result.reason}: {tail[0]}"[:300]
        return test.verdict(result.probes)
    result = run_sandboxed(code, test.stdin, limits)
    if not result.ok:
        tail = result.stderr.strip().splitlines()[-1:] or [""]
        return False, f"{result.reason}: {tail[0]}"[:300]
    if _normalized(result.stdout) != _normalized(test.expected):
        return False, "wrong output"
    return True, "passed"


class CodeEnvironment(EnvironmentInterface[CodeEnvMetadata]):
    """Single-turn: reward 1.0 when the last code block passes all of the sample's tests."""

    config_class = CodeEnvConfig

    def __init__(self, cfg: CodeEnvConfig | dict[str, Any] | None = None):
        self.cfg = CodeEnvConfig.model_validate(cfg or {})
        self.boundary = require_sandbox()  # refuses to start without a real sandbox
        self._executor = ThreadPoolExecutor(self.cfg.num_workers)

    def step(
        self,
        message_log_batch: list[LLMMessageLogType],
        metadata: list[CodeEnvMetadata],
        *args: Any,
        **kwargs: Any,
    ) -> EnvironmentReturn[CodeEnvMetadata]:
        limits = self.cfg.limits()
        codes, tests = [], []
        for i, (log, meta) in enumerate(zip(message_log_batch, metadata, strict=True)):
            tests.append(_parse_tests(i, meta.get("tests")))
            last = log[-1]["content"] if log and log[-1]["role"] == "assistant" else ""
            codes.append(extract_code(last))
        jobs = {
            (i, j): self._executor.submit(_check, code, test, limits)
            for i, code in enumerate(codes)
            if code is not None
            for j, test in enumerate(tests[i])
        }
        rewards, observations, answers = [], [], []
        new_metadata: list[CodeEnvMetadata] = []
        for i, (code, meta) in enumerate(zip(codes, metadata, strict=True)):
            if code is None:
                passed, reason = 0, "no fenced code block in the response"
            else:
                results = [jobs[(i, j)].result() for j in range(len(meta["tests"]))]
                passed = sum(ok for ok, _ in results)
                failures = [f"test {j}: {why}" for j, (ok, why) in enumerate(results) if not ok]
                reason = "; ".join(failures) if failures else "all tests passed"
            reward = 1.0 if code is not None and passed == len(meta["tests"]) else 0.0
            rewards.append(reward)
            answers.append(code)
            new_metadata.append({**meta, "tests_passed": passed, "reward_reason": reason})
            observations.append(
                {
                    "role": "environment",
                    "content": f"Environment: {passed}/{len(meta['tests'])} tests passed",
                }
            )
        return EnvironmentReturn(
            observations=observations,
            metadata=new_metadata,
            next_stop_strings=[self.cfg.stop_strings] * len(rewards),
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.ones(len(rewards), dtype=torch.bool),
            answers=answers,
        )

    def global_post_process_and_metrics(
        self, batch: BatchedDataDict
    ) -> tuple[BatchedDataDict, dict[str, Any]]:
        return batch, reward_metrics(batch)

    def shutdown(self) -> None:
        self._executor.shutdown(wait=True)
