"""Asynchronous GRPO in the flow: the run-ahead stages (prompts, generate, reward) of later
iterations run in a background thread while this iteration's logprob, advantage and train
run in the flow's own thread.

At iteration i (its checkpoint committed), the rollouts of iterations up to i + depth are
submitted: iteration j's generate reads the weights of step j - depth <= i, already on
storage. They run one iteration after the other, each stage a Prefect task run of the same
flow run (the thread carries the flow run's context), recorded in the manifest like any
stage, so a resumed run skips the ones that finished. Iteration i takes its rollouts when it
reaches its first run-ahead stage; a rollout that failed raises there, in that iteration.
"""

import contextvars
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.spec import Pipeline, RunAhead

Rollout = Callable[[int], dict[str, StageRef]]


class RolloutsAhead:
    """Rollouts of the iterations ahead, one background thread running them in order.

    ``rollout(iteration)`` runs the run-ahead stages of one iteration and returns their
    refs by name; ``last`` is the last iteration this flow run trains."""

    def __init__(self, run_ahead: RunAhead, depth: int, rollout: Rollout, last: int) -> None:
        self.stages = run_ahead.stages
        self.depth, self._rollout, self._last = depth, rollout, last
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollouts-ahead")
        self._futures: dict[int, Future[dict[str, StageRef]]] = {}
        self._submitted = -1

    def take(self, iteration: int) -> dict[str, StageRef]:
        """Iteration ``iteration``'s rollout refs, after submitting the rollouts of the
        iterations up to ``depth`` ahead of it. Taken again (a damaged input re-made), or
        never submitted, the rollout runs here, in the caller's thread."""
        self._submit(range(max(iteration, self._submitted + 1), iteration + self.depth + 1))
        future = self._futures.pop(iteration, None)
        return future.result() if future is not None else self._rollout(iteration)

    def _submit(self, iterations: Iterable[int]) -> None:
        for iteration in iterations:
            if iteration > self._last:
                return
            context = contextvars.copy_context()  # the flow run's, for its task runs
            self._futures[iteration] = self._executor.submit(context.run, self._rollout, iteration)
            self._submitted = iteration

    def close(self) -> None:
        """Cancel the rollouts not started and wait for the running one: nothing writes to
        the run after its flow run let go of the lease."""
        for future in self._futures.values():
            future.cancel()
        self._executor.shutdown(wait=True)
        self._futures.clear()


def rollouts_ahead(
    pipeline: Pipeline, config: Any, rollout: Rollout, iterations: list[int]
) -> RolloutsAhead | None:
    """The background rollouts of a run whose config overlaps them (async GRPO), else None."""
    depth = pipeline.ahead_depth(config)
    if pipeline.run_ahead is None or depth == 0 or not iterations:
        return None
    return RolloutsAhead(pipeline.run_ahead, depth, rollout, iterations[-1])
