"""What an operator sees of a run's flow runs in Prefect's UI and API, and filters by.

A flow run is named after the run it drives (``grpo-exp1``), carries the tags
``algorithm:<name>`` and ``run:<run_id>``, and its parameters hold the run id and storage
root it resolved to. The names are set once the run id is known (a flow run without one
makes a new id), so Prefect's generated name shows only until then.

Its task runs (the stages) carry no tags: Prefect asks the API server for tag concurrency
slots before every tagged task run starts, a round trip on the path of each stage (4-14 ms
a stage on this 2-core machine, more while the server records the run's events;
bench/RESULTS.md, issue 20); a task run is found through its flow run instead.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext

from nemo_rl_core.storage.handles import RunRef


def run_tags(algorithm: str, run_id: str) -> tuple[str, str]:
    return (f"algorithm:{algorithm}", run_tag(run_id))


def run_tag(run_id: str) -> str:
    return f"run:{run_id}"


def flow_run_name(algorithm: str, run_id: str) -> str:
    """``grpo-exp1``; a generated id (``grpo-20261125-201356-1a2b3c``) already starts so."""
    return run_id if run_id.startswith(f"{algorithm}-") else f"{algorithm}-{run_id}"


@contextmanager
def labelled_run(
    algorithm: str, run: RunRef, name: str | None = None, resolved: dict[str, Any] | None = None
) -> Iterator[None]:
    """Name and tag the current flow run (``name`` defaults to :func:`flow_run_name`); the
    task runs started inside the block stay untagged (see the module docstring).

    ``resolved`` replaces parameters of the flow run by the values they resolved to, e.g.
    a ``run_id`` of null by the id the run got: a retry of the flow run (Prefect's UI,
    ``prefect flow-run retry``) then continues this run instead of starting a new one.
    """
    labels = run_tags(algorithm, run.run_id)
    context = FlowRunContext.get()
    if context is not None and context.flow_run is not None:
        flow_run = context.flow_run
        with get_client(sync_client=True) as client:
            client.update_flow_run(
                flow_run.id,
                name=name or flow_run_name(algorithm, run.run_id),
                tags=sorted({*flow_run.tags, *labels}),
                parameters={**flow_run.parameters, **(resolved or {})},
            )
    yield
