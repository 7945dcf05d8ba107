"""Concurrency: a second flow run of an experiment (run_id) that another run drives is
refused by the storage lease, naming the holder, before it writes anything (from the
command line in one line, before torch or Prefect load); a lease that its killed holder
stopped renewing expires and is taken over."""

import time
import uuid
from pathlib import Path

import pytest
from python_forks import PythonForks
from reliability_helpers import CONFIG, REPO

from flows.grpo import grpo
from flows.lease import hold_lease
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.lease import LeaseHeldError, read_lease


def test_second_run_of_one_experiment_is_refused(prefect_api, tmp_path: Path) -> None:
    run = RunRef(str(tmp_path), "nightly")
    with open_storage(run).acquire_lease("flow-run first-night", ttl_s=600):
        state = grpo(
            config_path=str(CONFIG),
            run_id="nightly",
            storage_root=str(tmp_path),
            return_state=True,
        )
        assert state.is_failed()
        assert "leased by 'flow-run first-night' until" in state.message
        with pytest.raises(LeaseHeldError, match="leased by 'flow-run first-night' until"):
            state.result()
        written = sorted(p.name for p in (tmp_path / "runs" / "nightly").rglob("*"))
        assert written == ["LEASE.json"], "the refused run wrote something"


# The command line (``python -m flows``).
COMMAND = "import sys\nfrom flows.cli import main\nmain(sys.argv[1:])"


def test_second_run_from_the_command_line_is_refused_in_one_line_before_loading(
    tmp_path: Path, python_forks: PythonForks
) -> None:
    holder = str(uuid.uuid4())
    run = RunRef(str(tmp_path), "nightly")
    with open_storage(run).acquire_lease("flow-run first-night", ttl_s=600, flow_run_id=holder):
        started = time.monotonic()
        second = python_forks.run(  # a process of its own (tests/python_forks.py)
            COMMAND,
            ["grpo", "--config", str(CONFIG), "--run-id", "nightly", "--storage-root"]
            + [str(tmp_path)],
            cwd=REPO,
        )
        took = time.monotonic() - started
    print(f"refused after {took:.1f} s")  # the figure, with -s; not a timed assertion
    assert second.returncode == 3, second.stderr
    [line] = second.stderr.splitlines()
    assert line.startswith("error: run nightly (")
    assert "is leased by 'flow-run first-night' until 20" in line
    assert f"flow run {holder}" in line and "python -m flows.lease --break" in line
    assert second.heavy == [], "refused after loading"


def test_stale_lease_of_a_killed_run_expires_and_is_taken_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = RunRef(str(tmp_path), "nightly")
    open_storage(run).acquire_lease("killed worker", ttl_s=1.0)  # never renewed, never released
    with pytest.raises(LeaseHeldError, match="killed worker"):
        open_storage(run).acquire_lease("next night")
    time.sleep(1.2)
    monkeypatch.setenv("NEMO_RL_CORE_LEASE_TTL_S", "30")
    with hold_lease(run, owner="next night") as lease:
        assert read_lease(open_storage(run))["owner"] == "next night"
        assert lease.expires_at > time.time() + 20
    assert read_lease(open_storage(run)) is None, "released at the end of the run"


def test_a_failed_release_never_replaces_the_runs_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from nemo_rl_core.storage.lease import Lease
    from nemo_rl_core.storage.run_storage import StorageError

    def store_down(self):
        raise StorageError("LEASE.json: connection refused")

    monkeypatch.setattr(Lease, "release", store_down)
    # the run's own error surfaces, not the release's
    with (
        pytest.raises(ValueError, match="the generate stage failed"),
        hold_lease(RunRef(str(tmp_path), "down"), owner="a run"),
    ):
        raise ValueError("the generate stage failed")
    assert "releasing the lease failed too: LEASE.json: connection refused" in caplog.text
