"""Stage ``checkpoint``: retention of committed checkpoints (``save_period``, ``keep_top_k``).

The train stage already committed the new checkpoint (it is how weights reach the next
iteration); this stage decides which older ones to keep, as NeMo RL's ``checkpointing:``.
"""

from tasks.runtime import runtime_for
from tasks.stage import RunRef, StageOutputs, digest_of, open_storage, run_stage, stage_task


@stage_task("checkpoint")
def checkpoint(run: RunRef, iteration: int, trained: StageOutputs) -> StageOutputs:
    runtime = runtime_for(run)
    inputs = {"config": runtime.config_digest, "trained": digest_of(trained, "metrics")}
    settings = runtime.config.checkpointing

    def compute():
        storage = open_storage(run)
        deleted = storage.prune_checkpoints(
            settings.keep_top_k,
            metric_name=settings.metric_name,
            higher_is_better=settings.higher_is_better,
            save_period=settings.save_period,
        )
        kept = storage.committed_checkpoints()
        return {"retention": {"kept": kept, "deleted": deleted}}, {"checkpoints_kept": len(kept)}

    return run_stage(run, iteration, "checkpoint", inputs, compute)
