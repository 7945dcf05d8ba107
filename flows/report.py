"""Per-iteration Prefect artifact: the table NeMo RL users watch, from the manifest."""

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)

from tasks.stage import RunRef, open_storage

REPORTED = (
    ("reward", "mean_reward"),
    ("train", "loss"),
    ("train", "kl_penalty"),
    ("train", "probs_ratio_clamped_fraction"),
    ("train", "grad_norm"),
    ("train", "value_loss"),
    ("generate", "mean_gen_tokens_per_sample"),
)


def iteration_metrics(run: RunRef, iteration: int) -> dict[str, float]:
    """Flat ``stage/metric`` numbers and ``seconds/stage`` from the iteration's manifest."""
    stages = open_storage(run).read_manifest(iteration).get("stages", {})
    flat: dict[str, float] = {}
    for stage, entry in stages.items():
        for key, value in (entry.get("metrics") or {}).items():
            if isinstance(value, int | float):
                name = f"seconds/{stage}" if key == "seconds" else f"{stage}/{key}"
                flat[name] = float(value)
    return flat


def publish_iteration_report(run: RunRef, iteration: int) -> dict[str, float]:
    metrics = iteration_metrics(run, iteration)
    rows = [
        f"| {stage}/{name} | {metrics[f'{stage}/{name}']:.4g} |"
        for stage, name in REPORTED
        if f"{stage}/{name}" in metrics
    ]
    rows += [
        f"| {key} | {value:.2f} |"
        for key, value in sorted(metrics.items())
        if key.startswith("seconds/")
    ]
    table = "\n".join(["| metric | value |", "|---|---|", *rows])
    create_markdown_artifact(
        key=f"{run.run_id.lower().replace('_', '-').replace('.', '-')}-iter-{iteration}",
        markdown=f"### run `{run.run_id}` iteration {iteration}\n\n{table}\n",
        description=f"metrics of iteration {iteration}",
    )
    return metrics


class IterationProgress:
    """A Prefect progress artifact: the share of this flow run's iterations that are done."""

    def __init__(self, run: RunRef, iterations: list[int]) -> None:
        self.total = max(len(iterations), 1)
        self.done = 0
        self.artifact_id = create_progress_artifact(
            progress=0.0, description=f"run {run.run_id}: iterations {iterations}"
        )

    def iteration_done(self, iteration: int) -> None:
        self.done += 1
        update_progress_artifact(self.artifact_id, progress=100.0 * self.done / self.total)
