"""Check a stored run for damage nobody looks for: every stage output against its manifest
entry and every checkpoint file against its recorded size and sha256.

    python -m flows.verify --run-id RUN --storage-root results
exits 1 and names each damaged object (what was expected, what was found); 0 when intact.
A continue re-makes a damaged stage output from its inputs when a later stage reads it.
"""

import argparse
import sys

from prefect import flow
from prefect.artifacts import create_markdown_artifact

from flows.storage_block import load_storage_block
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.stage import stage_logger


@flow(name="verify-run", log_prints=True)
def verify_run(
    run_id: str, storage_root: str = "results", storage_block: str | None = None
) -> list[str]:
    """The damaged objects of run ``run_id`` (empty when every object matches its record)."""
    load_storage_block(storage_root, storage_block)
    damaged = open_storage(RunRef(storage_root, run_id)).verify()
    log = stage_logger()
    for problem in damaged:
        log.warning("run %s: damaged: %s", run_id, problem)
    verdict = f"{len(damaged)} damaged object(s)" if damaged else "every object intact"
    log.info("run %s: %s", run_id, verdict)
    lines = "\n".join(f"- {problem}" for problem in damaged)
    create_markdown_artifact(
        markdown=f"### run `{run_id}`: {verdict}\n\n{lines}\n", description="verify-run"
    )
    return damaged


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m flows.verify", description=__doc__)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--storage-root", default="results")
    args = parser.parse_args()
    problems = verify_run(args.run_id, args.storage_root)
    for problem in problems:
        print(f"damaged: {problem}")
    print(f"{len(problems)} damaged object(s)" if problems else "every object intact")
    sys.exit(1 if problems else 0)
