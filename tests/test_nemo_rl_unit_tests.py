"""NeMo RL v0.7.0's own unit tests for the modules this project mirrors beyond the shared
conformance runner's four suites (``../shared/conformance``), run against ``nemo_rl_core``
by that runner: its rewriting (CUDA to CPU, ``nemo_rl`` loading ``nemo_rl_core``) and its
pass/fail counting, with these files as one more suite. Read from the NeMo RL mirror at
test time; nothing of NeMo RL is stored here.

What is left out of each file, and why, is in ``exclude``: Ray actors, the Hugging Face hub,
NeMo RL's monolithic training loops and Ray workers' reports (here each algorithm is a flow
of stages) and private helpers of theirs."""

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from nemo_rl_examples import MIRROR, TAG

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT.parent / "shared" / "conformance" / "run.py"
# NeMo RL's own test helpers, which some of its tests import (``tests.unit.algorithms.utils``).
HELPERS = ["tests/unit/algorithms/utils.py"]
LOOP = "NeMo RL's monolithic {} loop driven through mocks; here the algorithm is a flow of stages"


def suites(file_spec: Any) -> dict[str, list[Any]]:
    """The files and, for each, what is in and what is out (with the reason)."""
    return {
        "beyond_runner": [
            file_spec("tests/unit/utils/test_checkpoint.py", include=["test_*"]),
            file_spec("tests/unit/utils/test_timer.py", include=["test_*", "Test*"]),
            file_spec("tests/unit/utils/test_config.py", include=["test_*", "Test*"]),
            file_spec("tests/unit/data/packing/test_algorithms.py", include=["test_*", "Test*"]),
            file_spec("tests/unit/environments/test_environment_utils.py", include=["test_*"]),
            file_spec("tests/unit/algorithms/test_reward_functions.py", include=["test_*"]),
            file_spec(
                "tests/unit/algorithms/test_utils.py",
                include=["test_maybe_pad_last_batch"],  # the baselines: the runner's suite
                exclude={
                    "test_get_tokenizer_*": "downloads Llama's tokenizer from the hub",
                    **dict.fromkeys(
                        [
                            "test_sync_colocated_*",
                            "test_async_non_colocated_*",
                            "test_minimal_inputs_no_counts_no_flops",
                            "test_empty_per_worker_token_counts_skips_imbalance",
                        ],
                        "print_performance_metrics: NeMo RL's report of its Ray workers' timings",
                    ),
                },
            ),
            file_spec(
                "tests/unit/algorithms/test_grpo.py",
                include=["test_gdpo_advantage_estimator_*"],  # GRPO's: the runner's suite
            ),
            file_spec(
                "tests/unit/algorithms/test_ppo.py",
                include=["test_raw_reward_*"],  # GAE and the value loss: the runner's ppo suite
                exclude={"test_create_advantage_estimator_*": "private factory of NeMo RL's"},
            ),
            file_spec(
                "tests/unit/evals/test_eval.py",
                include=["test_eval_pass_k_*", "test_eval_cons_k_*"],
                exclude={"test_run_env_eval_*": LOOP.format("evaluation (vLLM async)")},
            ),
            file_spec(
                "tests/unit/data/datasets/test_response_dataset_registry.py", include=["test_*"]
            ),
            file_spec(
                "tests/unit/data/datasets/test_preference_dataset.py",
                include=["test_*"],
                exclude={"test_build_in_dataset": "downloads HelpSteer3 and Tulu3 from the hub"},
            ),
            file_spec(
                "tests/unit/data/datasets/test_oai_format_dataset.py",
                include=["test_*"],
                exclude={"test_message_formatting": "downloads Qwen3's tokenizer from the hub"},
            ),
            file_spec(
                "tests/unit/data/datasets/test_preserving_dataset.py", include=["test_*", "Test*"]
            ),
            file_spec(
                "tests/unit/utils/test_logger.py",
                include=["TestFlattenDict::*"],
                exclude={
                    "TestFlattenDict::test_summarize_list": "private helper of NeMo RL's",
                    "TestFlattenDict::test_merge_generation_logger_workers": "private helper "
                    "of NeMo RL's Ray generation workers",
                },
            ),
        ]
    }


def load_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conformance_runner", RUNNER)
    assert spec is not None and spec.loader is not None
    runner = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = runner  # its dataclasses look their module up
    spec.loader.exec_module(runner)
    return runner


def export_helpers(target: Path) -> Path:
    """NeMo RL's test helper modules under ``target`` as the package ``tests.unit...``."""
    for path in HELPERS:
        source = subprocess.run(
            ["git", "-C", str(MIRROR), "show", f"{TAG}:{path}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        destination = target / path
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(source)
        for package in destination.relative_to(target).parents:
            (target / package / "__init__.py").touch()
    return target


def test_nemo_rl_unit_tests_of_mirrored_modules_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if not RUNNER.is_file():
        pytest.skip(f"no conformance runner at {RUNNER}")
    if not MIRROR.exists():
        pytest.skip(f"no NeMo RL mirror at {MIRROR} (set NEMO_RL_MIRROR)")
    runner = load_runner()
    runner.SUITES = suites(runner.FileSpec)
    runner.SUITE_ORDER = list(runner.SUITES)
    helpers = export_helpers(tmp_path / "helpers")
    status = runner.main(
        ["--mirror", str(MIRROR), "--ref", TAG, "--python", sys.executable]
        + ["--pythonpath", str(helpers), "--pythonpath", str(ROOT)]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    assert "min 100%: ok" in out
