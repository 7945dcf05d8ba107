"""The eval flow (Prefect's entrypoint ``flows/eval.py:evaluate``): score a checkpoint as
``nemo_rl_core.pipeline.algorithms.EVAL`` declares it, one Prefect task run per stage, then
publish the scores and every sample.

    prompts -> generate -> reward -> score

    python -m flows eval --config examples/configs/eval_addition_tiny.yaml \\
        generation.model_name=results/grpo_addition_tiny/runs/<run_id>/checkpoints/step_000060

pass@k and avg@n land in the score stage's manifest entry and a Prefect table artifact;
every sample (prompt, response, reward, ground truth) in a table artifact and, with
``eval.save_path``, in ``<save_path>/<run_id>/evaluation_data.parquet``. The same run_id
again skips the stages already complete; ``flows.rerun_stage`` reruns one of them.
"""

import json
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import create_table_artifact

from flows.lease import hold_lease
from flows.loop import run_iteration, run_pipeline_iteration
from flows.placement import check_placement
from flows.progress import artifact_key, shown_row
from flows.run_setup import lease_owner, load_storage_block, new_run_id, store_run_config
from nemo_rl_core.evals.config import EvalMasterConfig
from nemo_rl_core.evals.config_check import check_eval_config
from nemo_rl_core.experience.rollout_table import rollout_table, write_parquet
from nemo_rl_core.pipeline.algorithms import EVAL
from nemo_rl_core.pipeline.runtime import close_runtime
from nemo_rl_core.pipeline.stage_keys import check_stage_names
from nemo_rl_core.storage.handles import RunRef, open_storage

DEFAULT_STORAGE_ROOT = "results/eval"
ITERATION = 0  # an eval run is one pass over its prompts


def write_results(config: EvalMasterConfig, run: RunRef, table: Any) -> Path | None:
    """``evaluation_data.parquet`` (every sample) and ``config.json`` (what was scored,
    NeMo RL's fields) under ``<eval.save_path>/<run_id>/``; nothing without a save_path."""
    if config.eval.save_path is None:
        return None
    folder = Path(config.eval.save_path) / run.run_id
    path = write_parquet(table, folder / "evaluation_data.parquet")
    generation = config.generation
    described = {
        "model_name": generation.model_name,
        "dataset_name": config.data.dataset_name,
        "metric": config.eval.metric,
        "k_value": config.eval.k_value,
        "num_tests_per_prompt": config.eval.num_tests_per_prompt,
        "temperature": generation.temperature,
        "top_p": generation.top_p,
        "top_k": generation.top_k,
    }
    (folder / "config.json").write_text(json.dumps(described, indent=2) + "\n")
    return path


def publish(config: EvalMasterConfig, run: RunRef) -> dict[str, Any]:
    """The scores and the samples of a finished eval run: artifacts, files, a line."""
    stages = open_storage(run).read_manifest(ITERATION).stages
    scores = stages["score"].metrics
    batch = open_storage(run).read_batch(stages["reward"].outputs["batch"])
    table = rollout_table(batch, run.run_id, ITERATION)
    shown = {name: value for name, value in scores.items() if name != "seconds"}
    described = f"{config.generation.model_name} on {config.data.dataset_name}"
    create_table_artifact(
        table=[{"model": config.generation.model_name, **shown}],
        key=artifact_key(run.run_id, "scores"),
        description=f"eval run {run.run_id}: {described}",
    )
    create_table_artifact(
        table=[shown_row(row) for row in table.to_pylist()],
        key=artifact_key(run.run_id, "samples"),
        description=f"eval run {run.run_id}: every sample of {described}",
    )
    path = write_results(config, run, table)
    print(f"eval {described}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
    return {"scores": shown, "results": str(path) if path else None}


@flow(name="eval", log_prints=True)
def evaluate(
    config_path: str = EVAL.default_config,
    overrides: list[str] | None = None,
    run_id: str | None = None,
    storage_root: str | None = None,
    storage_block: str | None = None,
) -> dict:
    """Score ``generation.model_name`` on ``data:`` (pass@k, avg@n).

    ``run_id`` continues that run (a new id otherwise); ``storage_root`` defaults to
    ``results/eval``; ``storage_block`` names a prefect-aws ``AwsCredentials`` block
    for an ``s3://`` root."""
    config = check_eval_config(config_path, overrides)
    check_stage_names(config, EVAL)
    check_placement(config, EVAL)
    root = storage_root or DEFAULT_STORAGE_ROOT
    load_storage_block(root, storage_block)
    run = RunRef(root, run_id or new_run_id(EVAL.name))
    with hold_lease(run, owner=lease_owner()):
        store_run_config(EVAL, run, config)
        try:
            remade = run_iteration(
                lambda: run_pipeline_iteration(EVAL, config, run, ITERATION, ITERATION + 1),
                run,
                ITERATION,
            )
        finally:
            close_runtime(run)
        published = publish(config, run)
    return {"run_id": run.run_id, "storage_root": root, "remade": remade, **published}
