"""The manifest decides whether a stage runs: skip on same inputs, rerun on new or stale."""

import pytest
import torch
from prefect.task_engine import TaskRunTimeoutError

from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.pipeline.context import StageRef, StageResult
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.storage.run_storage import StorageError
from tasks.faults import FAULT_ENV, InjectedFault
from tasks.stage import is_transient, run_stage


class Counter:
    def __init__(self):
        self.calls = 0

    def __call__(self):
        self.calls += 1
        batch = BatchedDataDict({"x": torch.arange(4, dtype=torch.float32) * self.calls})
        return StageResult(
            {"batch": batch, "summary": {"calls": self.calls}}, {"calls": self.calls}
        )


def read_output_batch(run: RunRef, ref: StageRef) -> BatchedDataDict:
    return open_storage(run).read_batch(ref.outputs["batch"])


@pytest.fixture
def run(tmp_path) -> RunRef:
    return RunRef(str(tmp_path), "unit")


def test_same_inputs_skip_and_return_stored_outputs(run):
    compute = Counter()
    first = run_stage(run, 0, "reward", {"a": "1"}, compute)
    second = run_stage(run, 0, "reward", {"a": "1"}, compute)
    assert compute.calls == 1
    assert first == second
    assert read_output_batch(run, second)["x"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_changed_inputs_recompute(run):
    compute = Counter()
    run_stage(run, 0, "reward", {"a": "1"}, compute)
    outputs = run_stage(run, 0, "reward", {"a": "2"}, compute)
    assert compute.calls == 2
    assert read_output_batch(run, outputs)["x"].tolist() == [0.0, 2.0, 4.0, 6.0]


def test_stale_entry_recomputes(run):
    compute = Counter()
    run_stage(run, 3, "logprob", {"a": "1"}, compute)
    open_storage(run).mark_stale(3, ["logprob"])
    run_stage(run, 3, "logprob", {"a": "1"}, compute)
    assert compute.calls == 2


def test_injected_fault_fires_before_compute_and_records_nothing(run, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "reward@1")
    compute = Counter()
    run_stage(run, 0, "reward", {"a": "1"}, compute)  # other iteration: unaffected
    with pytest.raises(InjectedFault, match="'reward' of iteration 1"):
        run_stage(run, 1, "reward", {"a": "1"}, compute)
    assert compute.calls == 1
    assert "reward" not in open_storage(run).read_manifest(1).stages


class _State:
    def __init__(self, exc):
        self.data = exc


@pytest.mark.parametrize(
    ("exc", "retry"),
    [
        (StorageError("s3 down"), True),
        (ConnectionError(), True),
        (ValueError("bad config"), False),
        (FloatingPointError(), False),
        (TimeoutError(), True),
        (TaskRunTimeoutError("stage past orchestration.stage_timeout_seconds"), False),
    ],
)
def test_only_transient_errors_are_retried(exc, retry):
    assert is_transient(None, None, _State(exc)) is retry


def test_run_ids_are_validated():
    with pytest.raises(ValueError, match="run_id"):
        RunRef("/tmp", "../escape")
