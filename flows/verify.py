"""Check a stored run for damage nobody looks for: the outputs of every manifest entry,
stale ones too (a rerun marked them to be redone; they are said to be stale), and every
file of every committed checkpoint, against their recorded size and sha256.

    python -m flows.verify --run-id RUN --storage-root results
names each stale entry and each damaged object (what was expected, what was found) and
exits 1 if any object is damaged, 0 when every one is intact. The flow run ends Failed
when it found damage, its state message naming the damaged objects. A continue re-makes a
damaged stage output from its inputs when a later stage reads it.
"""

import argparse
import sys
from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed

from flows.storage_block import load_storage_block
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.verification import DamagedRunError, RunCheck
from tasks.stage import stage_logger

NAMED_IN_STATE = 5  # damaged objects named in the flow run's state message; the log has all


@flow(name="verify-run", log_prints=True)
def verify_run(
    run_id: str, storage_root: str = "results", storage_block: str | None = None
) -> RunCheck:
    """What a check of run ``run_id`` found (``RunCheck``); the flow run ends Failed, its
    caller gets ``DamagedRunError``, when an object is damaged."""
    load_storage_block(storage_root, storage_block)
    found = open_storage(RunRef(storage_root, run_id)).verify()
    log = stage_logger()
    for line in found.stale:
        log.warning("run %s: %s", run_id, line)
    for problem in found.damaged:
        log.warning("run %s: damaged: %s", run_id, problem)
    verdict = f"run {run_id}: {found.verdict()}"
    log.info(verdict)
    lines = "\n".join(
        [*(f"- damaged: {problem}" for problem in found.damaged)]
        + [f"- {line}" for line in found.stale]
    )
    create_markdown_artifact(markdown=f"### {verdict}\n\n{lines}\n", description="verify-run")
    if found.intact:
        return found
    named = "; ".join(found.damaged[:NAMED_IN_STATE])
    more = len(found.damaged) - NAMED_IN_STATE
    if more > 0:
        named += f"; and {more} more (the flow run's log names each)"
    return damaged(f"{verdict}: {named}", found)


def damaged(message: str, found: RunCheck) -> Any:
    """The end of a verify flow run that found damage: Failed, with ``message``; a caller in
    this process gets ``DamagedRunError`` holding every finding."""
    return Failed(message=message, data=DamagedRunError(message, found))


def print_check(found: RunCheck) -> None:
    for line in found.stale:
        print(f"stale: {line}")
    for problem in found.damaged:
        print(f"damaged: {problem}")
    print(found.verdict())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m flows.verify", description=__doc__)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--storage-root", default="results")
    args = parser.parse_args()
    checked: RunCheck
    try:
        checked = verify_run(args.run_id, args.storage_root)
    except DamagedRunError as err:
        checked = err.check
    print_check(checked)
    sys.exit(0 if checked.intact else 1)
