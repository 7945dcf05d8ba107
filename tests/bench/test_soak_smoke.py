"""The soak benchmark keeps working: ``bench/soak.py --smoke`` on the session's stack kills
one flow-run process mid-run, runs the deployment again until it completes, and ends with
the weights of the undisturbed reference run bit for bit."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from local_stack import LocalStack

pytestmark = [pytest.mark.stack, pytest.mark.e2e]
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1800)  # may be the first stack test: it then waits for the stack too
def test_soak_smoke(local_stack: LocalStack, stack_deployments: dict[str, str]) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "bench/soak.py",
            "--smoke",
            "--stack-state-dir",
            str(local_stack.state_dir),
        ],
        cwd=REPO,
        env=local_stack.env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "not recorded in bench/RESULTS.md" in result.stdout
    summary = json.loads(next(line for line in result.stdout.splitlines() if line.startswith("{")))
    assert summary["iterations_completed"] == 1 and summary["weights_bit_equal"]
    kills = [kill["flow_run_state"] for kill in summary["kills"]]
    assert kills == ["CRASHED"], result.stdout[-3000:]
    assert summary["flow_runs"] == 2 and summary["unplanned_failures"] == []
