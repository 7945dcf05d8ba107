"""The SFT flow's train stage on several ranks, against one one-process run of the same config
(made once, ``single``):

- with ``cluster.gpus_per_node: 2`` on a CPU machine the train stage runs as 2 ranks of this
  machine (one torchrun --standalone, gloo, launched by the flow's process), every other
  stage in the flow's process; with ``dtensor_cfg.tensor_parallel_size: 2`` (DTensor TP,
  mesh dp=1 x tp=2) each step equals the one-process flow's within 1e-5, also when a rank is
  lost: the stage runs again on a new group, every rank restarted, which then serves the
  next iteration with its weights still loaded;
- with the Megatron backend the two ranks train data parallel (dp=2), each step equal to the
  one-process DTensor flow's within 1e-5; rank 0 gathers both ranks' optimizer state into
  the checkpoint.

Across 2 "nodes" x 1 rank (``cluster.num_nodes: 2``), each node started by its own stage
worker of the train pool (two task-worker processes), joined by torchrun's c10d rendezvous on
this machine (127.0.0.1), gloo:

- one warm rank group serves both iterations (one torchrun per node for the whole flow run,
  stopped at its end); loss, grad norm and the weights equal the one-process flow's within
  1e-5, the checkpoint loads in transformers;
- a group whose flow run died (its process killed, Prefect marks it Crashed) stops and
  frees the pool's workers; so does one that no order reached for its idle time, and the
  flow's next order starts a fresh group;
- a rank killed in the middle of a step fails the attempt; the next attempt restarts every
  rank, and the run ends bit-identical to the undisturbed run (at its first step: one step
  killed and run again, against the undisturbed run's checkpoint of that step);
- a pool that serves fewer nodes than asked is said before any work, and the stage fails
  naming the nodes and ranks that never started, or never joined the rendezvous.

CPU-heavy: each attempt (rank group) starts two torchruns (~30 s each on 2 cores), so the
runs that only prove a rerun take one step.
"""

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from flow_testing import assert_bit_identical, checkpoint_dir, stages_of
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.settings import PREFECT_API_URL
from prefect.states import Crashed
from test_placement_flow import flow_run_of, logs_of, stage_workers
from transformers import AutoModelForCausalLM

from flows import placed_nodes
from flows.placed_nodes import END, KEEP, RELEASE, between_orders
from flows.placement import PlacementError
from flows.rank_group import IDLE_ENV, idle_seconds
from flows.sft import sft
from nemo_rl_core.storage.handles import RunRef, open_storage
from tasks.faults import FAULT_ENV, FAULT_NOTES

pytestmark = [pytest.mark.e2e, pytest.mark.distributed]
CONFIG = Path(__file__).resolve().parents[2] / "examples" / "configs" / "sft_tiny.yaml"
OVERRIDES = [
    "sft.val_at_start=false",
    "policy.train_global_batch_size=8",
    "policy.train_micro_batch_size=4",
]
TWO_NODES = ["cluster.num_nodes=2", "cluster.gpus_per_node=1"]
POOL = "train-pool"
KILL_RANK1 = "kill-rank1"  # asked of iteration 0's train stage by the pool's workers


def run(root: Path, run_id: str, pool: str | None, *extra: str, steps: int = 2) -> None:
    placed = [*TWO_NODES, f"++cluster.placement.train={pool}"] if pool else []
    sft(
        config_path=str(CONFIG),
        overrides=[*OVERRIDES, f"sft.max_num_steps={steps}", *placed, *extra],
        run_id=run_id,
        storage_root=str(root),
    )


def task_runs_of(run_id: str, key: str, iteration: int | None = None, within_s: float = 30) -> list:
    """The task runs of the run's flow run whose task key starts with ``key`` (of
    ``iteration``: named ``...-it<iteration>``), once the server holds each one's final
    state (within ``within_s``): the flow learns a run's end from Prefect's event, and the
    server records the state from that event a moment later, which can be after the flow
    run's end."""
    flow_run = flow_run_of(f"sft-{run_id}")
    deadline = time.monotonic() + within_s
    with get_client(sync_client=True) as client:
        while True:
            task_runs = [
                t
                for t in client.read_task_runs(
                    flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
                )
                if t.task_key.startswith(key)
                and (iteration is None or t.name.endswith(f"-it{iteration}"))
            ]
            if all(t.state is not None and t.state.is_final() for t in task_runs):
                return task_runs
            assert time.monotonic() < deadline, [(t.name, t.state) for t in task_runs]
            time.sleep(0.2)


def node_task_runs(run_id: str, pool: str, iteration: int, within_s: float = 30) -> list:
    """The node task runs that started the train stage's rank groups at ``iteration``."""
    return task_runs_of(run_id, f"stage-node@{pool}", iteration, within_s)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("single")
    run(root, "single", None)
    return root


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two stage workers of one pool, serving every two-node run of the module (a worker
    costs a process start). Rank 1 of iteration 0's train stage kills itself, once per run:
    a run whose storage notes that kill as fired already trains undisturbed."""
    workers = tmp_path_factory.mktemp("workers")
    with stage_workers(POOL, workers, count=2, env={FAULT_ENV: f"train@0:{KILL_RANK1}"}):
        yield POOL


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory, pool: str) -> Path:
    """The undisturbed two-node run."""
    root = tmp_path_factory.mktemp("nodes")
    storage = open_storage(RunRef(str(root), "nodes"))
    storage.write_rendezvous_note(0, "train", FAULT_NOTES, KILL_RANK1, {"pid": None})
    run(root, "nodes", pool)
    assert storage.read_rendezvous_note(0, "train", FAULT_NOTES, KILL_RANK1) == {"pid": None}
    return root


def test_train_stage_on_two_local_ranks(
    single: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tensor parallel over the two ranks; rank 1 is killed in the middle of iteration 0's
    step: the stage runs again with every rank restarted (a new rank group), and that group
    serves iteration 1 too, launched once for both."""
    monkeypatch.setenv(FAULT_ENV, f"train@0:{KILL_RANK1}")
    tp2 = "policy.dtensor_cfg.tensor_parallel_size=2"
    run(tmp_path, "ranks", None, "cluster.gpus_per_node=2", tp2)
    assert "ranks" not in stages_of(single, "single", 0)["train"]["ran_on"]
    rank0 = set()
    for iteration in (0, 1):
        expected = stages_of(single, "single", iteration)["train"]["metrics"]
        train = stages_of(tmp_path, "ranks", iteration)["train"]
        assert train["ran_on"]["ranks"] == 2
        got = train["metrics"]
        assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], abs=1e-5)
        rank0.add(train["ran_on"]["pid"])
    assert len(rank0) == 1, f"one rank 0 process trained both iterations: {rank0}"
    assert (tmp_path / "runs" / "ranks" / "checkpoints" / "step_000002" / "COMMITTED").exists()
    fired = open_storage(RunRef(str(tmp_path), "ranks")).read_rendezvous_note(
        0, "train", FAULT_NOTES, KILL_RANK1
    )
    assert fired is not None and fired["pid"] is not None, "rank 1 was killed once"
    # the killed group's order failed (and a stop order sent in case its rank 0 still
    # served was cancelled, unserved); the next group took iteration 0's order again, then
    # iteration 1's, and stopped at the flow run's end
    orders = task_runs_of("ranks", "stage-ranks/")
    done = sorted(t.name for t in orders if t.state.is_completed())
    assert done == ["train-stage-it0", "train-stage-it1", "train-stop-it1"], orders
    assert "train-stage-it0" in [t.name for t in orders if not t.state.is_completed()], orders
    logs = logs_of(flow_run_of("sft-ranks").id)
    again = [line for line in logs if "running it again with every rank restarted" in line]
    assert len(again) == 1 and "rank 1 was killed by SIGKILL" in again[0], logs


@pytest.mark.megatron
def test_megatron_on_two_local_ranks(
    single: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One process of either backend takes the same first step (fp32, AdamW at the DTensor
    run's constant LR; their grad norms differ by ~2e-6 here); the group's ranks keep
    Megatron's model and optimizer for the second, whose grad norm the two backends' first
    updates, a rounding apart, move by ~4e-5. The group releases its devices between the
    orders, as one machine's ranks on GPUs do (on CPU there is nothing to move: the ranks
    take the path, and ``test_megatron_offload.py`` checks the moves)."""
    monkeypatch.setattr(placed_nodes, "between_orders", lambda *_: RELEASE)
    megatron = (
        "policy.megatron_cfg.enabled=true",
        "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.optimizer.lr=0.001",
        "policy.megatron_cfg.scheduler.lr_warmup_iters=0",
    )
    run(tmp_path, "megatron", None, "cluster.gpus_per_node=2", *megatron)
    rank0 = set()
    for iteration in (0, 1):
        expected = stages_of(single, "single", iteration)["train"]["metrics"]
        train = stages_of(tmp_path, "megatron", iteration)["train"]
        got = train["metrics"]
        assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], abs=1e-5 * 10**iteration)
        assert got["global_valid_toks"] == expected["global_valid_toks"]
        assert train["ran_on"]["ranks"] == 2
        rank0.add(train["ran_on"]["pid"])
    assert len(rank0) == 1, f"one rank group trained both iterations: {rank0}"
    checkpoint = checkpoint_dir(tmp_path, "megatron", 2)
    AutoModelForCausalLM.from_pretrained(checkpoint)
    optimizer_files = sorted(p.name for p in (checkpoint / "optimizer").iterdir())
    assert optimizer_files == ["optim_tp0_dp0.pt", "optim_tp0_dp1.pt"]  # both ranks', by rank 0


def test_two_nodes_each_started_by_a_worker_train_as_one_process(
    single: Path, two_nodes: Path
) -> None:
    storage = open_storage(RunRef(str(two_nodes), "nodes"))
    for iteration in (0, 1):
        expected = stages_of(single, "single", iteration)["train"]["metrics"]
        train = stages_of(two_nodes, "nodes", iteration)["train"]
        got = train["metrics"]
        assert got["loss"] == pytest.approx(expected["loss"], abs=1e-5)
        assert got["grad_norm"] == pytest.approx(expected["grad_norm"], abs=1e-5)
        assert got["global_valid_toks"] == expected["global_valid_toks"]
        assert (train["ran_on"]["ranks"], train["ran_on"]["pool"]) == (2, POOL)
    # one warm rank group for the whole run: one torchrun per node, started at iteration 0
    # and stopped when the flow run ended (its node task runs completed: the workers are
    # free again), which took the order of each iteration
    nodes = node_task_runs("nodes", POOL, 0)
    assert len(nodes) == 2 and all(t.state.is_completed() for t in nodes), nodes
    assert node_task_runs("nodes", POOL, 1) == [], "iteration 1 started no torchrun"
    orders = sorted(t.name for t in task_runs_of("nodes", f"stage-ranks@{POOL}/"))
    assert orders == ["train-stage-it0", "train-stage-it1", "train-stop-it1"], orders
    workers = set()
    for node in (0, 1):
        beat = storage.read_stage_run(0, f"train.node-{node}-of-2")
        assert beat is not None and beat.ran_on.pool == POOL
        workers.add(beat.ran_on.worker)
    assert workers == {f"{POOL}-0", f"{POOL}-1"}, "one node per worker"
    # the rendezvous was on this machine's loopback: node 0 published its host name
    assert socket.gethostbyname(socket.gethostname()) == "127.0.0.1"
    # written by rank 0 in the layout one process writes: transformers loads it, and its
    # weights are the one-process run's within 1e-5
    got = AutoModelForCausalLM.from_pretrained(checkpoint_dir(two_nodes, "nodes", 2)).state_dict()
    one = AutoModelForCausalLM.from_pretrained(checkpoint_dir(single, "single", 2)).state_dict()
    assert got.keys() == one.keys()
    for name, expected in one.items():
        torch.testing.assert_close(got[name], expected, atol=1e-5, rtol=0)


def test_a_group_whose_flow_run_died_stops_and_frees_the_workers(tmp_path: Path, pool: str) -> None:
    """The flow's process is SIGKILLed once iteration 0's train stage committed: no stop order
    comes. Once Prefect holds its flow run Crashed (what a work pool's worker does for a
    flow run whose process died), rank 0 stops the group: its node task runs complete and
    the pool's workers are free (the next test's runs need both)."""
    storage = open_storage(RunRef(str(tmp_path), "orphan"))
    storage.write_rendezvous_note(0, "train", FAULT_NOTES, KILL_RANK1, {"pid": None})
    placed = [*TWO_NODES, f"++cluster.placement.train={pool}"]
    command = [sys.executable, "-m", "flows", "sft", "--config", str(CONFIG)]
    command += ["--run-id", "orphan", "--storage-root", str(tmp_path)]
    command += [*OVERRIDES, "sft.max_num_steps=50", *placed]
    env = {**os.environ, "PREFECT_API_URL": str(PREFECT_API_URL.value())}
    with (tmp_path / "flow.log").open("w") as log:
        flow = subprocess.Popen(
            command, cwd=CONFIG.parents[2], env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "runs" / "orphan" / "checkpoints" / "step_000001").exists():
            assert flow.poll() is None, (tmp_path / "flow.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "iteration 0 never committed"
            time.sleep(0.2)
    finally:
        flow.kill()
        flow.wait(60)
    flow_run = flow_run_of("sft-orphan")
    with get_client(sync_client=True) as client:
        client.set_flow_run_state(
            flow_run.id, Crashed(message="its process was killed"), force=True
        )
    nodes = node_task_runs("orphan", pool, 0, within_s=120)
    assert len(nodes) == 2 and all(t.state.is_completed() for t in nodes), nodes
    assert stages_of(tmp_path, "orphan", 0)["train"]["ran_on"]["ranks"] == 2


def test_a_group_no_order_reaches_stops_and_the_next_order_starts_a_fresh_one(
    tmp_path: Path, two_nodes: Path, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The flow's groups stop after 10 s without an order, and iteration 1's batch stage
    stalls 13 s: iteration 0's group stops by itself in between (no stop order reached it),
    its node task runs complete, and both workers of the pool take the fresh group that
    iteration 1's order starts. The run is the two-node run, bit for bit."""
    monkeypatch.setenv(IDLE_ENV, "10")
    monkeypatch.setenv(FAULT_ENV, "batch@1:stall13")
    storage = open_storage(RunRef(str(tmp_path), "idle"))
    storage.write_rendezvous_note(0, "train", FAULT_NOTES, KILL_RANK1, {"pid": None})
    run(tmp_path, "idle", pool)
    first, fresh = node_task_runs("idle", pool, 0), node_task_runs("idle", pool, 1)
    assert len(first) == 2 and all(t.state.is_completed() for t in first), first
    assert len(fresh) == 2 and all(t.state.is_completed() for t in fresh), fresh
    first_orders = task_runs_of("idle", f"stage-ranks@{POOL}/idle-it0-")
    done = [t.name for t in first_orders if t.state.is_completed()]
    assert done == ["train-stage-it0"], first_orders  # no stop order: it stopped by itself
    workers = set()
    for node in (0, 1):
        beat = storage.read_stage_run(1, f"train.node-{node}-of-2")
        assert beat is not None
        workers.add(beat.ran_on.worker)
    assert workers == {f"{POOL}-0", f"{POOL}-1"}, "both workers were free for the fresh group"
    # said by the flow: found ended before the order, or as the order came
    said = ("ended since its last order", "its rank group stopped before the order reached it")
    logs = logs_of(flow_run_of("sft-idle").id)
    assert any(why in line for line in logs for why in said), logs
    assert_bit_identical(checkpoint_dir(tmp_path, "idle", 2), checkpoint_dir(two_nodes, "nodes", 2))


def test_a_group_on_a_pool_shared_with_another_stage_ends_after_each_step(
    tmp_path: Path, two_nodes: Path, pool: str
) -> None:
    """The batch stage is placed on the train stage's pool too: a group kept warm would hold
    both workers, and iteration 1's batch stage would wait for one until it failed. The group
    ends after each step instead; the run is the two-node run, bit for bit."""
    storage = open_storage(RunRef(str(tmp_path), "shared"))
    storage.write_rendezvous_note(0, "train", FAULT_NOTES, KILL_RANK1, {"pid": None})
    run(
        tmp_path,
        "shared",
        pool,
        f"++cluster.placement.batch={pool}",
        "++cluster.placement_wait_seconds=120",
    )
    for iteration in (0, 1):
        assert len(node_task_runs("shared", pool, iteration)) == 2, iteration
        assert stages_of(tmp_path, "shared", iteration)["batch"]["ran_on"]["pool"] == pool
    assert_bit_identical(
        checkpoint_dir(tmp_path, "shared", 2), checkpoint_dir(two_nodes, "nodes", 2)
    )


def test_a_killed_rank_reruns_every_rank_bit_identical(
    tmp_path: Path, two_nodes: Path, pool: str
) -> None:
    """Rank 1 SIGKILLs itself in iteration 0's backward pass: both nodes' launches fail,
    the attempt runs again on both workers with every rank restarted. One step: a rerun's
    ranks load the step's inputs and weights as every attempt's do, which the two-node run's
    second step proves against the one-process run."""
    started = time.monotonic()
    run(tmp_path, "killed", pool, steps=1)
    # the lost rank ends its launch at once, not after the collectives' 30-minute timeout
    assert time.monotonic() - started < 600
    storage = open_storage(RunRef(str(tmp_path), "killed"))
    fired = storage.read_rendezvous_note(0, "train", FAULT_NOTES, KILL_RANK1)
    assert fired is not None and fired["pid"] is not None, fired
    attempts = node_task_runs("killed", pool, 0)
    assert len(attempts) == 4, "two attempts (rank groups) of two nodes"
    assert sum(t.state.is_completed() for t in attempts) == 2, "the second, stopped at the end"
    logs = logs_of(flow_run_of("sft-killed").id)
    again = [line for line in logs if "running it again with every rank restarted" in line]
    assert len(again) == 1 and "rank 1 was killed by SIGKILL" in again[0], logs
    assert_bit_identical(
        checkpoint_dir(tmp_path, "killed", 1), checkpoint_dir(two_nodes, "nodes", 1)
    )
    got = stages_of(tmp_path, "killed", 0)["train"]["metrics"]
    expected = stages_of(two_nodes, "nodes", 0)["train"]["metrics"]
    assert (got["loss"], got["grad_norm"]) == (expected["loss"], expected["grad_norm"])


def test_a_pool_short_of_nodes_is_said_and_fails_naming_the_missing_ranks(
    tmp_path: Path,
) -> None:
    with stage_workers("short-pool", tmp_path, count=1):
        # the one worker starts a node, whose rendezvous waits 4 s for the other
        with pytest.raises(PlacementError) as never_joined:
            run(tmp_path, "rdzv", "short-pool", "++cluster.rendezvous_timeout_seconds=4")
        message = str(never_joined.value)
        assert "pool 'short-pool'" in message and "were not started by a worker" in message
        assert "join_timeout=4s; node(s) [" in message and "never joined" in message
        logs = logs_of(flow_run_of("sft-rdzv").id)
        assert any(
            "pool 'short-pool' has 1 live stage worker(s), and stage 'train' needs 2" in line
            for line in logs
        ), logs
        # nobody takes the second node within placement_wait_seconds
        with pytest.raises(
            PlacementError,
            match=r"pool 'short-pool': no stage worker of the pool started node\(s\) \[[01]\] "
            r"\(rank [01] of world size 2\) within cluster.placement_wait_seconds=6",
        ):
            run(
                tmp_path,
                "wait",
                "short-pool",
                "++cluster.placement_wait_seconds=6",
                "++cluster.rendezvous_timeout_seconds=15",
            )
    assert "train" not in stages_of(tmp_path, "wait", 0)


def test_what_a_group_holds_between_orders_follows_who_else_needs_its_devices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a pool, the other stages placed there need its workers: it ends. On one machine's
    GPUs the flow's generation needs them between steps: the ranks offload to host memory
    (HF and Megatron alike). On CPUs, or on a pool of its own, it keeps everything."""
    config = SimpleNamespace(cluster=SimpleNamespace(placement={"train": POOL}))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert between_orders(config, "train", None) == KEEP
    assert between_orders(config, "train", POOL) == KEEP
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert between_orders(config, "train", None) == RELEASE
    assert between_orders(config, "train", POOL) == KEEP
    config.cluster.placement["batch"] = POOL
    assert between_orders(config, "train", POOL) == END


def test_the_idle_time_is_the_flows_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(IDLE_ENV, raising=False)
    assert idle_seconds() == 1800
    monkeypatch.setenv(IDLE_ENV, "90")
    assert idle_seconds() == 90
    for wrong in ("0", "-5", "soon", "inf"):
        monkeypatch.setenv(IDLE_ENV, wrong)
        with pytest.raises(ValueError, match=f"{IDLE_ENV}='{wrong}': the seconds a rank group"):
            idle_seconds()
