"""Model-written Python run against test cases in a sandbox (``env.code``).

The last fenced code block of the model's answer runs against the sample's test cases in
one fresh bubblewrap sandbox per sample (``code_sandbox``: namespaces, seccomp, rlimits, a
cgroup where delegated; the environment refuses to start where that sandbox cannot be
built). A test case is ``{"input": stdin, "output": expected stdout}`` (a run of the
program of its own, its stdout compared here after stripping trailing whitespace per
line) or ``{"assert": "assert f(2) == 4"}`` (``code_assertions``: judged in a judge's
sandbox, which asks the sample's sandbox only for what the solution's calls return; the
asserts of one sample are judged against one run of its code, as a test file's asserts
run after one import). Expected values never enter the sample's sandbox. Reward 1.0 when
every test passes; whatever the program does (hang, crash, early exit, escape attempt,
a costly answer) fails that sample only, and the reason is in its metadata.
"""

import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypedDict

import torch

from nemo_rl_core.data.interfaces import LLMMessageLogType
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.code_assertions import AssertTest, compile_assert_test
from nemo_rl_core.environments.code_sandbox import (
    SandboxLimits,
    SandboxResult,
    require_sandbox,
    run_sample,
)
from nemo_rl_core.environments.config import CodeEnvConfig
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.environments.metrics import reward_metrics
from nemo_rl_core.environments.sandbox_judge import JudgePool

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


def _program_verdict(result: SandboxResult, expected: str) -> tuple[bool, str]:
    if not result.ok:
        tail = result.stderr.strip().splitlines()[-1:] or [""]
        return False, f"{result.reason}: {tail[0]}"[:300]
    if _normalized(result.stdout) != _normalized(expected):
        return False, "wrong output"
    return True, "passed"


def _check(
    code: str, tests: list[_StdoutTest | AssertTest], limits: SandboxLimits, judges: JudgePool
) -> list[tuple[bool, str]]:
    """(passed, why) per test, in order, from one sandbox run of the sample."""
    stdout_tests = [t for t in tests if isinstance(t, _StdoutTest)]
    assert_tests = [t for t in tests if isinstance(t, AssertTest)]
    result = run_sample(code, [t.stdin for t in stdout_tests], assert_tests, limits, judges)
    programs = iter(zip(result.programs, [t.expected for t in stdout_tests], strict=True))
    verdicts = iter(result.verdicts)
    return [
        _program_verdict(*next(programs)) if isinstance(test, _StdoutTest) else next(verdicts)
        for test in tests
    ]


class CodeEnvironment(EnvironmentInterface[CodeEnvMetadata]):
    """Single-turn: reward 1.0 when the last code block passes all of the sample's tests."""

    config_class = CodeEnvConfig

    def __init__(self, cfg: CodeEnvConfig | dict[str, Any] | None = None):
        self.cfg = CodeEnvConfig.model_validate(cfg or {})
        self.boundary = require_sandbox()  # refuses to start without a real sandbox
        limits = self.cfg.limits()
        self._judges = JudgePool(self.boundary, limits.memory_mb << 20, limits.output_bytes)
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
            i: self._executor.submit(_check, code, tests[i], limits, self._judges)
            for i, code in enumerate(codes)
            if code is not None
        }
        rewards, observations, answers = [], [], []
        new_metadata: list[CodeEnvMetadata] = []
        for i, (code, meta) in enumerate(zip(codes, metadata, strict=True)):
            if code is None:
                passed, reason = 0, "no fenced code block in the response"
            else:
                results = jobs[i].result()
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
        self._judges.close()
