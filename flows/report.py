"""Per-iteration Prefect artifact: the table NeMo RL users watch, from the manifest."""

import contextvars
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Self

from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    update_progress_artifact,
)

from nemo_rl_core.pipeline.spec import Pipeline
from nemo_rl_core.storage.handles import RunRef, open_storage


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


def metrics_table(
    pipeline: Pipeline, run: RunRef, iteration: int, metrics: dict[str, float]
) -> str:
    """The iteration's Markdown table: the metrics its stages report, then seconds per stage."""
    rows = [
        f"| {stage}/{name} | {metrics[f'{stage}/{name}']:.4g} |"
        for stage, name in pipeline.reported_metrics()
        if f"{stage}/{name}" in metrics
    ]
    rows += [
        f"| {key} | {value:.2f} |"
        for key, value in sorted(metrics.items())
        if key.startswith("seconds/")
    ]
    table = "\n".join(["| metric | value |", "|---|---|", *rows])
    return f"### run `{run.run_id}` iteration {iteration}\n\n{table}\n"


class IterationReports:
    """The Prefect artifacts of a flow run: one metrics table per iteration and a progress
    bar over this flow run's iterations.

    Each finished iteration's two API calls run in one background thread, in the flow
    run's context, while the next iteration's stages run: nothing downstream waits for
    them, and on 2 shared cores they took ~0.1 s between iterations (bench/RESULTS.md,
    issue 8). Leaving the ``with`` block waits for every publication and raises the
    first failure (unless the block is already raising).
    """

    def __init__(self, pipeline: Pipeline, run: RunRef, iterations: list[int]) -> None:
        self.pipeline = pipeline
        self.run = run
        self.total = max(len(iterations), 1)
        self.done = 0
        self.artifact_id = create_progress_artifact(
            progress=0.0, description=f"run {run.run_id}: iterations {iterations}"
        )
        self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="report")
        self._published: list[Future] = []

    def iteration_done(self, iteration: int) -> dict[str, float]:
        """The iteration's metrics (from its manifest), published in the background."""
        metrics = iteration_metrics(self.run, iteration)
        self.done += 1
        context = contextvars.copy_context()
        self._published.append(
            self._publisher.submit(
                context.run,
                self._publish,
                iteration,
                metrics_table(self.pipeline, self.run, iteration, metrics),
                100.0 * self.done / self.total,
            )
        )
        return metrics

    def _publish(self, iteration: int, markdown: str, progress: float) -> None:
        create_markdown_artifact(
            key=f"{self.run.run_id.lower().replace('_', '-').replace('.', '-')}-iter-{iteration}",
            markdown=markdown,
            description=f"metrics of iteration {iteration}",
        )
        update_progress_artifact(self.artifact_id, progress=progress)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._publisher.shutdown(wait=True)
        if exc_type is None:
            for publication in self._published:
                publication.result()
