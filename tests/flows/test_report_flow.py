"""End to end: what a GRPO run shows and leaves for a person, with every logger on.

One short run with validation at its start and end, then: the run's log folder (each
logger read back, the rollouts queried with DuckDB, the curves), the Prefect artifacts,
and ``python -m flows.report`` on the stored run."""

import json
from pathlib import Path

import duckdb
import pytest
from prefect.client.orchestration import get_client

from flows.grpo import grpo
from flows.report import main as report_main
from flows.report import run_summaries, summary_row
from nemo_rl_core.storage.handles import RunRef, open_storage

pytestmark = pytest.mark.e2e
RUN = "Observed_run"
STEPS = 2
OVERRIDES = [
    f"grpo.max_num_steps={STEPS}",
    "grpo.val_at_start=true",
    "grpo.val_at_end=true",
    "grpo.max_val_samples=4",
    "grpo.val_batch_size=4",
    "logger.tensorboard_enabled=true",
    "logger.mlflow_enabled=true",
    "logger.wandb_enabled=true",
    "logger.num_val_samples_to_print=1",
]


@pytest.fixture(scope="module")
def observed(tiny_config: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("storage")
    logs = tmp_path_factory.mktemp("logs")
    summary = grpo(
        config_path=str(tiny_config),
        overrides=[*OVERRIDES, f"logger.log_dir={logs}"],
        run_id=RUN,
        storage_root=str(root),
    )
    return root, logs / RUN, summary


def test_metrics_jsonl_holds_nemo_rl_metrics_with_the_run_id(observed):
    _, run_dir, summary = observed
    assert summary["iterations"] == [0, 1, 2]  # iteration 2 only validates
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    assert {record["run_id"] for record in records} == {RUN}
    train = {r["step"]: r for r in records if "train/loss" in r}
    assert sorted(train) == [1, 2]
    for record in train.values():
        for key in (
            "train/reward",
            "train/kl_penalty",
            "train/probs_ratio",
            "train/probs_ratio_clamped_fraction",
            "train/approx_entropy",
            "train/token_mult_prob_error",
            "train/mean_gen_tokens_per_sample",
            "train/advantages/mean",
            "train/baseline_reward/pct_mixed",
            "train/total_num_tokens",
        ):
            assert key in record, key
    validation = sorted(r["step"] for r in records if "validation/accuracy" in r)
    assert validation == [0, 2]
    timing = [r for r in records if "timing/train/total_step_time" in r]
    assert len(timing) == STEPS and all(r["timing/train/generation"] > 0 for r in timing)
    performance = [r for r in records if "performance/generated_tokens_per_sec" in r]
    assert len(performance) == STEPS


def test_each_logger_wrote_the_run(observed):
    import mlflow
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, run_dir, _ = observed
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/kl_penalty")] == [1, 2]
    assert [e.step for e in events.Scalars("validation/accuracy")] == [0, 2]
    mlflow.set_tracking_uri(f"sqlite:///{run_dir / 'mlflow.db'}")
    try:
        runs = mlflow.search_runs(search_all_experiments=True)
    finally:
        mlflow.set_tracking_uri(None)
    assert runs["tags.nemo_rl_core.run_id"].tolist() == [RUN]
    assert runs["params.grpo.max_num_steps"].tolist() == [str(STEPS)]
    # NeMo RL's layout: W&B's dir is <log folder>/wandb, where W&B makes its own wandb/
    assert list((run_dir / "wandb" / "wandb").glob(f"offline-run-*-{RUN}/run-{RUN}.wandb"))


def test_rollouts_and_validation_samples_are_queryable(observed):
    _, run_dir, _ = observed
    per_iteration = duckdb.sql(
        f"select iteration, count(*), count(ground_truth), avg(response_tokens) > 0 "
        f"from '{run_dir}/rollouts/*.parquet' group by iteration order by iteration"
    ).fetchall()
    assert per_iteration == [(0, 16, 16, True), (1, 16, 16, True)]  # 4 prompts x 4 samples
    validated = duckdb.sql(
        f"select iteration, count(*), sum(greedy::int) "
        f"from '{run_dir}/validation/*.parquet' group by iteration order by iteration"
    ).fetchall()
    assert validated == [(0, 20, 4), (2, 20, 4)]  # 4 prompts: 4 sampled + 1 greedy each
    assert (run_dir / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_prefect_artifacts_per_iteration_and_progress(observed):
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    def artifacts(key: str) -> list:  # newest version first
        with get_client(sync_client=True) as client:
            return client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                sort=ArtifactSort.CREATED_DESC,
            )

    table = artifacts("observed-run-rollouts-iter-1")
    progress = artifacts("observed-run-progress")
    assert table and table[0].type == "table"
    rows = json.loads(table[0].data)
    assert len(rows) == 16 and {"prompt", "response", "reward", "reason"} <= set(rows[0])
    assert progress and progress[0].type == "progress" and progress[0].data == 100.0
    # One row per iteration, as the summary table prints it, updated as each one ends.
    root, _, _ = observed
    stored = run_summaries(open_storage(RunRef(str(root), RUN)))
    metrics = artifacts("observed-run-metrics")
    assert len(metrics) == len(stored) == STEPS + 1
    assert json.loads(metrics[0].data) == [summary_row(s) for s in stored]


def test_report_command_prints_and_plots_the_stored_run(observed, tmp_path, capsys):
    root, _, _ = observed
    report_main(["--run-id", RUN, "--storage-root", str(root), "--plot", str(tmp_path / "c.png")])
    out = capsys.readouterr().out.splitlines()
    assert [line.split(" | ")[0] for line in out[:3]] == ["iter   0", "iter   1", "iter   2"]
    assert "val acc" in out[0] and "kl " in out[1] and "gen tok/s" in out[1]
    assert out[3] == f"run {RUN}: 3 iterations"
    assert (tmp_path / "c.png").is_file()
