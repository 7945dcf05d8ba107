"""A training flow run's reports, iteration by iteration: a terminal line, the loggers
(NeMo RL's names), the rollouts as Parquet in the run's log folder, Prefect artifacts (the
resolved config, each iteration's metrics, the table of metrics per iteration, a table of
the first rollouts, the run's progress); at the end a summary table and a PNG of the curves.

Run log folder (``<logger.log_dir>/<run_id>/``)::

    metrics.jsonl, tensorboard/, mlflow.db, wandb/    what the loggers write
    rollouts/iter_000003.parquet                     every sample the iteration trained on
    validation/iter_000003.parquet                   every validation sample (when validated)
    curves.png                                       the run's curves so far
"""

import contextvars
import re
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Self
from uuid import UUID

import pyarrow as pa
import yaml
from prefect.artifacts import (
    create_markdown_artifact,
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)

from flows.report import (
    VALIDATION_STAGE,
    IterationSummary,
    format_line,
    manifest_metrics,
    nemo_rl_records,
    plot_curves,
    run_summaries,
    summary_row,
    summary_table,
)
from nemo_rl_core.experience.rollout_table import format_samples, rollout_table, write_parquet
from nemo_rl_core.pipeline.context import BATCH
from nemo_rl_core.pipeline.spec import Pipeline, split_round
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.manifest import Manifest, StageEntry
from nemo_rl_core.utils.logger import Logger

ROLLOUT_STAGE = "reward"  # its batch holds every scored sample the iteration trains on
TEXT_IN_ARTIFACT = 500  # characters of a prompt or response shown in the Prefect table
ROLLOUTS_IN_ARTIFACT = 64
"""Samples an iteration's rollouts table shows in the Prefect UI. Each table is a row of the
API server's database: a run of NeMo RL's size (2048 samples an iteration, 1000 steps) would
write gigabytes there. Every sample is in the log folder's Parquet."""
ITERATIONS_IN_ARTIFACT = 100
"""Iterations the metrics-per-iteration table shows: each iteration stores the table anew
(a new version of the artifact), so a whole-history table grows with the square of the
run's length. ``python -m flows.report`` prints every iteration."""


def artifact_key(run_id: str, *parts: object) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from the run id."""
    slug = re.sub(r"[^a-z0-9-]+", "-", run_id.lower())
    return "-".join([slug, *(str(part) for part in parts)])


def metrics_markdown(
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


def _final_round(manifest: Manifest, stage: str) -> StageEntry | None:
    rounds = [name for name in manifest.stages if split_round(name)[0] == stage]
    last = max(rounds, key=lambda name: split_round(name)[1]) if rounds else None
    return None if last is None else manifest.stages[last]


class IterationReports:
    """The reports of one flow run's iterations.

    Each iteration's reports (its manifest read, the terminal line, loggers, Parquet,
    Prefect artifacts) are made in one background thread, in order, in the flow run's
    context, while the next iteration's stages run: nothing downstream waits for them (on 2
    shared cores the artifact calls alone took ~0.1 s per iteration, and on S3 the manifest
    read is a round trip; bench/RESULTS.md, issues 8 and 30). Leaving the ``with`` block
    waits for every publication and raises the first failure (unless the block is already
    raising), then prints the summary table and writes the curves; ``history`` then holds
    each iteration's metrics.
    """

    def __init__(
        self, pipeline: Pipeline, run: RunRef, config: Any, iterations: list[int], total: int
    ) -> None:
        self.pipeline, self.run, self.config = pipeline, run, config
        self.total = max(total, 1)
        self.logger = Logger(config.logger, run.run_id)
        self._publisher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="report")
        self._published: list[Future] = []
        first = iterations[0] if iterations else total
        # Prefect's async_dispatch types every call as R | Coroutine; from sync code it is R.
        self.progress_id: UUID = create_progress_artifact(  # type: ignore[assignment]
            progress=100.0 * first / self.total,
            key=artifact_key(run.run_id, "progress"),
            description=f"run {run.run_id}: iterations done of {total}",
        )
        resolved = config.model_dump(mode="json")
        self._submit(self.logger.log_hyperparams, resolved)
        self._submit(self._publish_config, resolved)
        # The per-iteration table shows the iterations of earlier flow runs of this run too.
        self._summaries: dict[int, IterationSummary] = {}
        self.history: list[dict[str, float]] = []
        self._submit(self._load_earlier, first)

    def _submit(self, work: Any, *args: Any) -> None:
        context = contextvars.copy_context()
        self._published.append(self._publisher.submit(context.run, work, *args))

    def iteration_done(self, iteration: int) -> None:
        """Print the iteration's line and publish its reports, in the background."""
        self._submit(self._publish, iteration)

    def _publish(self, iteration: int) -> None:
        manifest = open_storage(self.run).read_manifest(iteration)
        metrics = manifest_metrics(manifest)
        self.history.append(metrics)
        summary = IterationSummary.from_metrics(iteration, metrics)
        print(format_line(summary))
        for record in nemo_rl_records(metrics, iteration):
            self.logger.log_metrics(record.metrics, record.step, prefix=record.prefix)
        rollouts = self._table(manifest, ROLLOUT_STAGE, iteration, "rollouts")
        if rollouts is not None:
            shown = artifact_rollout_rows(rollouts)
            create_table_artifact(
                table=shown,
                key=artifact_key(self.run.run_id, "rollouts", "iter", iteration),
                description=(
                    f"run {self.run.run_id}: {len(shown)} of the {rollouts.num_rows} samples of "
                    f"iteration {iteration} (every one: "
                    f"{self._table_path('rollouts', iteration)})"
                ),
            )
        validation = self._table(manifest, VALIDATION_STAGE, iteration, "validation")
        to_print = self.config.logger.num_val_samples_to_print
        if validation is not None and to_print:
            print(
                f"validation samples, iteration {iteration}:\n{format_samples(validation, to_print)}"
            )
        create_markdown_artifact(
            key=artifact_key(self.run.run_id, "iter", iteration),
            markdown=metrics_markdown(self.pipeline, self.run, iteration, metrics),
            description=f"metrics of iteration {iteration}",
        )
        self._summaries[iteration] = summary
        create_table_artifact(
            table=[summary_row(summary) for summary in recent_summaries(self._summaries)],
            key=artifact_key(self.run.run_id, "metrics"),
            description=(
                f"run {self.run.run_id}: metrics per iteration (the summary table; its last "
                f"{ITERATIONS_IN_ARTIFACT} iterations, every one: python -m flows.report)"
            ),
        )
        update_progress_artifact(self.progress_id, progress=100.0 * (iteration + 1) / self.total)

    def _publish_config(self, resolved: dict[str, Any]) -> None:
        """The resolved config beside the flow run's parameters (a config path and
        overrides), as stored with the run: what an operator reads in the UI."""
        create_markdown_artifact(
            key=artifact_key(self.run.run_id, "config"),
            markdown=f"```yaml\n{yaml.safe_dump(resolved, sort_keys=False)}```\n",
            description=f"run {self.run.run_id}: the resolved config (runs/<run_id>/config.yaml)",
        )

    def _load_earlier(self, first: int) -> None:
        stored = run_summaries(open_storage(self.run))
        self._summaries.update({s.iteration: s for s in stored if s.iteration < first})

    def _table(
        self, manifest: Manifest, stage: str, iteration: int, folder: str
    ) -> pa.Table | None:
        """The stage's batch as a readable table, written to ``<folder>/iter_N.parquet``
        (None when the stage did not run or keeps no samples: SFT's validation loss)."""
        entry = _final_round(manifest, stage)
        if entry is None or BATCH not in entry.outputs:
            return None
        batch = open_storage(self.run).read_batch(entry.outputs[BATCH])
        table = rollout_table(batch, self.run.run_id, iteration)
        write_parquet(table, self._table_path(folder, iteration))
        return table

    def _table_path(self, folder: str, iteration: int) -> Path:
        return self.logger.run_dir / folder / f"iter_{iteration:06d}.parquet"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc_info: object) -> None:
        self._publisher.shutdown(wait=True)
        try:
            if exc_type is None:
                for publication in self._published:
                    publication.result()
                summaries = run_summaries(open_storage(self.run))
                print(summary_table(self.run.run_id, summaries))
                curves = plot_curves(self.run.run_id, summaries, self.logger.run_dir / "curves.png")
                print(f"curves: {curves}; logs, rollouts: {self.logger.run_dir}")
        finally:
            self.logger.close()


def artifact_rollout_rows(rollouts: pa.Table) -> list[dict[str, Any]]:
    """The rollouts table's rows for the Prefect UI: the first ``ROLLOUTS_IN_ARTIFACT``
    samples (whole groups of a prompt's generations, as the batch orders them), texts cut."""
    return [shown_row(row) for row in rollouts.slice(0, ROLLOUTS_IN_ARTIFACT).to_pylist()]


def recent_summaries(summaries: dict[int, IterationSummary]) -> list[IterationSummary]:
    """The last ``ITERATIONS_IN_ARTIFACT`` iterations' summaries, in order."""
    return [summaries[i] for i in sorted(summaries)[-ITERATIONS_IN_ARTIFACT:]]


def shown_row(row: dict[str, Any]) -> dict[str, Any]:
    """A rollout row for the Prefect UI: long texts cut."""
    cut = {}
    for key, value in row.items():
        if isinstance(value, str) and len(value) > TEXT_IN_ARTIFACT:
            value = value[:TEXT_IN_ARTIFACT] + " ..."
        cut[key] = value
    return cut
