"""The eval flow on the embedded default: a GRPO run's checkpoint scored at temperature 0
gives pass@1 equal to the validate stage's greedy accuracy on the same held-out problems,
answer for answer; every sample lands in Parquet. Its stages skip, resume and rerun as
every pipeline's do (tests/orchestration)."""

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flows.eval import evaluate
from flows.grpo import grpo
from nemo_rl_core.evals.eval import eval_cons_k
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import ObjectRef

pytestmark = pytest.mark.e2e
CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"
PROBLEMS = 32
GRPO_OVERRIDES = [
    "grpo.max_num_steps=1",
    "grpo.val_at_end=true",
    f"grpo.max_val_samples={PROBLEMS}",
    f"grpo.val_batch_size={PROBLEMS}",
    f"data.validation.num_samples={PROBLEMS}",
    "grpo.num_prompts_per_step=4",
    "grpo.num_generations_per_prompt=4",
    "policy.train_global_batch_size=16",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=16",
]


def stages(root: Path, run_id: str, iteration: int = 0) -> dict:
    path = root / "runs" / run_id / f"iter_{iteration:06d}" / "MANIFEST.json"
    return json.loads(path.read_text())["stages"]


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("storage")
    logs = root / "logs"
    grpo(
        config_path=str(CONFIGS / "grpo_addition_tiny.yaml"),
        overrides=[*GRPO_OVERRIDES, f"logger.log_dir={logs}"],
        run_id="train",
        storage_root=str(root),
    )
    checkpoint = root / "runs" / "train" / "checkpoints" / "step_000001"
    overrides = [
        f"generation.model_name={checkpoint}",
        f"data.num_samples={PROBLEMS}",
        f"eval.save_path={root / 'results'}",
    ]
    summary = evaluate(
        config_path=str(CONFIGS / "eval_addition_tiny.yaml"),
        overrides=overrides,
        run_id="scored",
        storage_root=str(root),
    )
    return root, logs, overrides, summary


def test_pass_at_1_is_the_validate_stage_greedy_accuracy(scored):
    root, logs, _, summary = scored
    validation = stages(root, "train", 1)["validate"]["metrics"]
    scores = stages(root, "scored")["score"]["metrics"]
    assert scores["num_prompts"] == validation["num_prompts"] == PROBLEMS
    assert scores["pass@1"] == validation["greedy_accuracy"]
    assert summary["scores"]["pass@1"] == scores["pass@1"] == scores["avg@1"]
    # the same problems, answered the same way
    greedy = pq.read_table(logs / "train" / "validation" / "iter_000001.parquet").to_pandas()
    greedy = greedy[greedy["greedy"]]
    samples = pq.read_table(summary["results"]).to_pandas()
    assert list(samples["prompt"]) == list(greedy["prompt"])
    assert list(samples["response"]) == list(greedy["response"])
    assert samples["reward"].mean() == pytest.approx(scores["avg@1"])
    assert samples["greedy"].all()  # temperature 0
    described = json.loads((Path(summary["results"]).parent / "config.json").read_text())
    assert described["model_name"].endswith("step_000001") and described["k_value"] == 1


def test_cons_at_k_votes_over_the_extracted_answers(scored, tmp_path):
    root, _, overrides, _ = scored
    tests = [
        "eval.metric=cons@k",
        "eval.num_tests_per_prompt=4",
        "eval.k_value=3",
        "generation.temperature=1.0",
    ]
    summary = evaluate(
        config_path=str(CONFIGS / "eval_addition_tiny.yaml"),
        overrides=[*overrides, *tests],
        run_id="voted",
        storage_root=str(tmp_path),
    )
    scores = stages(tmp_path, "voted")["score"]["metrics"]
    assert scores["num_samples"] == 4 * PROBLEMS
    batch = open_storage(RunRef(str(tmp_path), "voted")).read_batch(
        ObjectRef.from_dict(stages(tmp_path, "voted")["reward"]["outputs"]["batch"])
    )
    answers = [info["extracted_answer"] for info in batch["extra_env_info"]]
    assert any(answer is not None for answer in answers)
    expected = eval_cons_k(batch["total_reward"], 4, 3, answers) / PROBLEMS
    assert summary["scores"]["cons@3"] == scores["cons@3"] == pytest.approx(expected)
    assert 0.0 <= scores["cons@3"] <= scores["pass@3"]
