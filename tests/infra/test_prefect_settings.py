"""The Prefect settings the project ships in ``prefect.toml`` reach every process started
from the project root (flows, workers, the ephemeral API server, ``infra/stack.sh``'s
server); a misspelt key there would be ignored without a word."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_server_records_task_run_events_in_batches() -> None:
    env = {k: v for k, v in os.environ.items() if "TASK_RUN_RECORDER" not in k}
    script = (
        "import json; from prefect.settings import get_current_settings as s; "
        "r = s().server.services.task_run_recorder; "
        "print(json.dumps([r.batch_size, r.flush_interval]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    batch_size, flush_interval = json.loads(out.stdout.strip().splitlines()[-1])
    assert batch_size > 1
    # Prefect truncates the interval to whole seconds; below 1 its flush loop would spin.
    assert flush_interval >= 1 and flush_interval == int(flush_interval)
