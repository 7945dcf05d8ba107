"""A stage run across processes (the training stage of ``cluster.num_nodes x
gpus_per_node`` ranks) as a warm rank group: placed on a pool (``cluster.placement.train``),
one node task run per node on the stage's pool, each a stage worker's torchrun of that
node's ranks, joined by torchrun's c10d rendezvous (``nemo_rl_core.distributed.node_launch``);
not placed (one node), this machine's ranks, one torchrun launched from the flow's own
process (``flows.local_node``). The group stays up for the flow run's iterations (``flows.rank_group``): each iteration orders the
stage from the group's rank 0 as one task run, rank 0 hands the order to every rank and
commits the stage; the ranks keep the weights loaded in between. The flow run stops its
groups when it ends (``close_rank_groups``). A group holds its pool's workers while it is up:
where other stages are placed on the same pool, it ends after each order; one machine's ranks
on GPUs the flow shares move their models to host memory between orders instead
(``between_orders``).

An attempt is one group: one ``Rendezvous`` (a fresh ``--rdzv-id``) and its ``num_nodes``
task runs (or its local launch). An iteration orders its stage from the flow run's group if every node of it
still runs, else from a new one; a node is never run again alone (its peers are gone):

- the order completed: the stage's committed outputs, and the group waits for the next;
- the group ended instead (every node's task run ends with it), as its nodes say:
  - a rank or node lost (``RanksLost``, a crashed task run, a worker whose heartbeat
    stopped) or a rendezvous that did not complete (``RendezvousIncomplete``): a new group,
    every rank restarted, up to a local stage's retries;
  - a rank raised (``RanksFailed``), and nothing was lost: the stage fails with its message;
- a node no worker of the pool started within ``cluster.placement_wait_seconds`` (the pool
  serves fewer nodes than asked): the stage fails naming the pool and the missing nodes and
  their ranks; nodes already started end at their rendezvous's timeout
  (``cluster.rendezvous_timeout_seconds``), which names the nodes that never joined.
"""

import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import torch
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import State
from prefect.states import Cancelled
from prefect.task_runs import TaskRunWaiter

from flows.lease import current_flow_run
from flows.local_node import LocalNode
from flows.placement import (
    POLL_S,
    START_WORKER,
    PlacedRun,
    PlacedTask,
    PlacementError,
    PoolWatch,
    apply_async,
    flow_run_block,
    live_workers,
    mark_task_run_crashed,
    on_pool,
    placed_pool,
    stored_stage,
    task_run_state,
)
from flows.pool_tasks import (
    node_heartbeat_name,
    pool_tasks,
    rank_group_key,
    rank_group_program,
)
from flows.rank_group import STAGE, STOP, idle_seconds, rank_group_task
from nemo_rl_core.config.cluster import TRAIN_STAGE
from nemo_rl_core.distributed.node_launch import (
    NodeEnd,
    RanksFailed,
    Rendezvous,
    RendezvousNotes,
)
from nemo_rl_core.distributed.virtual_cluster import training_world
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.storage.handles import RunRef, open_storage
from nemo_rl_core.utils.config import ConfigError
from tasks.stage import STAGE_TASK_OPTIONS, stage_logger

STOP_WAIT_S = 120.0  # how long a flow run's end waits for a stopped group's nodes to end


def ranks_of(node_rank: int, per_node: int) -> str:
    """A node's global ranks, as messages name them: ``ranks 2-3`` or ``rank 1``."""
    first, last = node_rank * per_node, (node_rank + 1) * per_node - 1
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def warn_if_pool_is_short(config: Any) -> None:
    """Before any work: a training stage of several nodes whose pool has fewer live stage
    workers than nodes is said, naming the pool and the count (its missing nodes wait up to
    ``cluster.placement_wait_seconds`` for workers, then the stage fails naming them)."""
    pool = placed_pool(config, TRAIN_STAGE)
    if pool is None:
        return
    nodes, per_node = training_world(config)
    if nodes == 1:
        return
    with get_client(sync_client=True) as client:
        workers = live_workers(client, pool)
    if len(workers) < nodes:
        stage_logger().warning(
            "pool %r has %d live stage worker(s), and stage %r needs %d (cluster.num_nodes=%d "
            "x %d ranks per node = world size %d, one worker per node): the missing nodes wait "
            "up to cluster.placement_wait_seconds=%g; start more with %s",
            pool,
            len(workers),
            TRAIN_STAGE,
            nodes,
            nodes,
            per_node,
            nodes * per_node,
            config.cluster.placement_wait_seconds,
            START_WORKER.format(pool=pool),
        )


@dataclass
class NodeRun:
    """One node of an attempt (its task run on the pool, or its launch from this process),
    and what the waiter saw of it."""

    node_rank: int
    placed: PlacedRun | LocalNode
    started: bool = False  # a worker took it (it ran, or runs)
    final: State | None = None
    lost: str | None = None  # why the waiter declared it lost (its heartbeat stopped)


class Attempt:
    """One attempt of the stage, a warm rank group: its rendezvous, one task run per node on
    the pool (``pool`` None: its one node launched from this process), and the orders sent
    to its rank 0 (``flows.rank_group``)."""

    def __init__(
        self, config: Any, run: RunRef, iteration: int, name: str, pool: str | None
    ) -> None:
        self.run, self.iteration, self.name, self.pool = run, iteration, name, pool
        attempt = f"{run.run_id}-it{iteration}-{name}-{uuid.uuid4().hex[:12]}"
        self.rendezvous = Rendezvous.for_cluster(config, attempt)
        self.notes = RendezvousNotes(open_storage(run), iteration, name, attempt)
        self.orders = rank_group_key(pool, attempt)
        self.sent: list[UUID] = []  # the orders' task runs
        self.wait_s = float(config.cluster.placement_wait_seconds)
        self.idle_s = idle_seconds()  # its ranks stop on their own after this without orders
        self.between_orders = between_orders(config, name, pool)
        self.ended = threading.Event()
        if pool is None:
            self.nodes = [self.local_node()]
        else:
            self.nodes = [self.pool_node(pool, node) for node in range(self.rendezvous.nnodes)]
        self.submitted_at = time.monotonic()

    def local_node(self) -> NodeRun:
        """The group's one node, this machine's ranks, launched from this process."""
        if self.rendezvous.nnodes > 1:
            raise ConfigError(
                f"cluster.num_nodes={self.rendezvous.nnodes}: stage {self.name!r} spans "
                f"{self.rendezvous.nnodes} machines, and runs here only on this one: place it "
                f"on a pool (cluster.placement.{self.name}) whose workers each launch one node"
            )
        release = self.between_orders == RELEASE
        program = rank_group_program(self.run, self.orders, self.idle_s, release)
        return NodeRun(0, LocalNode(program, self.rendezvous, self.notes, self.ended), True)

    def pool_node(self, pool: str, node_rank: int) -> NodeRun:
        """Node ``node_rank``'s task run on ``pool``, submitted now."""
        placed: PlacedTask[None] = PlacedTask(
            pool_tasks(pool).node,
            {
                "run": self.run,
                "iteration": self.iteration,
                "name": self.name,
                "orders": self.orders,
                "idle_s": self.idle_s,
                "node_rank": node_rank,
                "rendezvous": self.rendezvous,
                "storage_block": flow_run_block(),
            },
            node_heartbeat_name(self.name, node_rank, self.rendezvous.nnodes),
            self.node_label(node_rank),
            lambda: None,  # a node commits nothing itself: its group's orders do
        )
        run = PlacedRun(placed, self.run, self.iteration, pool, self.wait_s, self.ended)
        return NodeRun(node_rank, run)

    def order(
        self, kind: str, iteration: int, upstream: dict[str, StageRef], stage: str | None = None
    ) -> UUID:
        """Send the group an order (``flows.rank_group``: STAGE or STOP) for ``stage`` (its
        own, or another stage on the training ranks); its task run."""
        TaskRunWaiter.instance()  # listening before the run can end
        parameters = {
            "run": self.run,
            "iteration": iteration,
            "name": stage or self.name,
            "upstream": upstream,
            "kind": kind,
        }
        order = apply_async(rank_group_task(self.orders), parameters)
        TaskRunWaiter.add_done_callback(order, self.ended.set)
        self.sent.append(order)
        return order

    @staticmethod
    def tick(watch: PoolWatch | None, checked_at: float) -> tuple[bool, float]:
        """Whether this pass of a wait reads the server (once a ``POLL_S``, asking the pool
        whether it has a live worker too), and when it last did."""
        if time.monotonic() - checked_at < POLL_S:
            return False, checked_at
        if watch is not None:
            watch.check()
        return True, time.monotonic()

    def step(
        self, iteration: int, upstream: dict[str, StageRef], watch: PoolWatch | None, stage: str
    ) -> bool:
        """Order ``stage`` of ``iteration`` from ``upstream``: True once the order completed
        (rank 0 committed the stage), False once the group ended first or the order failed
        (the group then ends: ``wait`` for it); raises ``PlacementError`` once a node was not
        started by a worker within ``placement_wait_seconds`` (cancelling it)."""
        order = self.order(STAGE, iteration, upstream, stage)
        checked_at = time.monotonic()
        while True:
            check, checked_at = self.tick(watch, checked_at)
            self.ended.clear()
            state = task_run_state(order, check)
            if state is not None and state.is_final():
                if state.is_completed():
                    return True
                break
            for node in self.nodes:
                if node.final is None:
                    self.poll(node, check)
            if any(node.final is not None for node in self.nodes):
                break
            waiting = [node for node in self.nodes if not node.started]
            if waiting and time.monotonic() - self.submitted_at > self.wait_s:
                self.cancel_orders("its rank group never started")
                raise self.unserved()
            self.ended.wait(timeout=max(0.0, checked_at + POLL_S - time.monotonic()))
        if any(node.final is None and node.started for node in self.nodes):
            # a failed order ended rank 0, and with it the group; should rank 0 still serve
            # (its task run failed before the order reached it), this ends it
            self.order(STOP, iteration, {})
        return False

    def live(self) -> bool:
        """Whether every node's task run still runs (read from the server, now)."""
        for node in self.nodes:
            if node.final is None:
                self.poll(node, check=True)
        return all(node.final is None for node in self.nodes)

    def stop(self, iteration: int) -> None:
        """End the group (a stop order) and wait up to ``STOP_WAIT_S`` for its nodes' task
        runs to end, so that the pool's workers are free for what comes next."""
        self.order(STOP, iteration, {})
        deadline = time.monotonic() + STOP_WAIT_S
        while any(node.final is None for node in self.nodes) and time.monotonic() < deadline:
            self.ended.clear()
            self.live()
            self.ended.wait(timeout=POLL_S)
        if any(node.final is None for node in self.nodes):
            stage_logger().warning(
                "run %s: the rank group of stage %r (attempt %s) did not end within %g s of "
                "its stop order; its nodes end on their own after %g s without orders",
                self.run.run_id,
                self.name,
                self.rendezvous.attempt,
                STOP_WAIT_S,
                self.idle_s,
            )
        self.cancel_orders("its rank group ended")

    def cancel_orders(self, why: str) -> None:
        """Cancel the orders no rank took (their group ended), so that none waits forever."""
        with get_client(sync_client=True) as client:
            for order in self.sent:
                state = client.read_task_run(order).state
                if state is None or not state.is_final():
                    client.set_task_run_state(order, Cancelled(message=why), force=True)

    def node_label(self, node_rank: int) -> str:
        ranks = ranks_of(node_rank, self.rendezvous.nproc_per_node)
        return (
            f"node {node_rank} of {self.rendezvous.nnodes} ({ranks}) of stage {self.name!r}'s "
            f"rank group started at iteration {self.iteration} (attempt "
            f"{self.rendezvous.attempt})"
        )

    def wait(self, watch: PoolWatch | None) -> None:
        """Until every node's task run ended; raises ``PlacementError`` once a node was
        not started by a worker within ``placement_wait_seconds`` (cancelling it)."""
        checked_at = time.monotonic()
        while any(node.final is None for node in self.nodes):
            check, checked_at = self.tick(watch, checked_at)
            self.ended.clear()
            for node in self.nodes:
                if node.final is None:
                    self.poll(node, check)
            if any(node.final is not None and not node.final.is_completed() for node in self.nodes):
                self.cancel_unstarted("another node of its attempt ended first")
            waiting = [node for node in self.nodes if node.final is None and not node.started]
            if waiting and time.monotonic() - self.submitted_at > self.wait_s:
                raise self.unserved()
            if any(node.final is None for node in self.nodes):
                self.ended.wait(timeout=max(0.0, checked_at + POLL_S - time.monotonic()))

    def poll(self, node: NodeRun, check: bool) -> None:
        state = node.placed.state(check)
        if state is None:
            return
        if state.is_final():
            node.final, node.started = state, True
            return
        if state.is_running() and isinstance(node.placed, PlacedRun):
            node.started = True
            silent = node.placed.heartbeat.silent_for()
            if silent is not None:
                # its worker is gone (or stalled): a delivery to another worker would join
                # a rendezvous whose other nodes have left; the attempt is run again instead
                node.lost = f"its worker's heartbeat on storage stopped {silent:.0f} s ago"
                mark_task_run_crashed(node.placed.task_run_id, node.lost)

    def cancel_unstarted(self, why: str) -> None:
        """Cancel the nodes no worker started yet (a worker then skips them; one that took
        it already finds the attempt ended and joins nothing)."""
        waiting = [
            (node, node.placed)
            for node in self.nodes
            if node.final is None and not node.started and isinstance(node.placed, PlacedRun)
        ]
        if not waiting:
            return
        with get_client(sync_client=True) as client:
            for node, placed in waiting:
                node.final = Cancelled(message=why)
                client.set_task_run_state(placed.task_run_id, node.final, force=True)

    def unserved(self) -> PlacementError:
        assert self.pool is not None, "a group's local node is started as it is made"
        missing = [node.node_rank for node in self.nodes if not node.started]
        with get_client(sync_client=True) as client:
            workers = live_workers(client, self.pool)
        message = (
            f"stage {self.name!r} of iteration {self.iteration} {on_pool(self.pool)}: "
            f"no stage worker of the pool started node(s) {missing} ("
            + ", ".join(ranks_of(node, self.rendezvous.nproc_per_node) for node in missing)
            + f" of world size {self.rendezvous.world_size}) within "
            f"cluster.placement_wait_seconds={self.wait_s:g}; the stage needs "
            f"{self.rendezvous.nnodes} workers of the pool at once, it has "
            f"{len(workers)} live ({workers or 'none'}): start more with "
            f"{START_WORKER.format(pool=self.pool)}"
        )
        self.cancel_unstarted(message)
        return PlacementError(message)

    def unstarted(self, ends: list[NodeEnd]) -> list[int]:
        """The nodes no worker started while the attempt was open: never taken, or taken
        only once another node had ended (``late``: queued behind it on a busy worker)."""
        late = {end.node_rank for end in ends if end.kind == "late"}
        return [node.node_rank for node in self.nodes if not node.started or node.node_rank in late]

    def ends(self) -> list[NodeEnd]:
        """How each node a worker took ended: its own note, or what its task run's state
        says."""
        found = []
        for node in self.nodes:
            if node.final is None or not node.started:
                continue
            end = self.notes.end(node.node_rank)
            if node.lost is not None or node.final.is_crashed():
                why = node.lost or node.final.message or "crashed"
                end = NodeEnd(node.node_rank, "lost", f"{self.node_label(node.node_rank)}: {why}")
            elif end is None:
                state = f"{node.final.name}: {node.final.message}"
                kind = "finished" if node.final.is_completed() else "failed"
                end = NodeEnd(node.node_rank, kind, f"{self.node_label(node.node_rank)}: {state}")
            found.append(end)
        return found


_groups: dict[tuple[RunRef, str | None, str], tuple[Attempt, int]] = {}
"""The warm rank groups by run, flow run and stage, with the last iteration each served."""


def warm_group(
    config: Any, run: RunRef, iteration: int, name: str, pool: str | None, watch: PoolWatch | None
) -> Attempt:
    """This flow run's rank group of stage ``name`` if every node of it still runs, else a
    new one (the old one's end is said: it stopped on its own, or lost a node, while the
    flow ran other stages)."""
    key = (run, current_flow_run(), name)
    if key in _groups:
        group, _ = _groups[key]
        if group.live():
            return group
        del _groups[key]
        group.wait(watch)
        group.cancel_orders("its rank group ended")
        stage_logger().warning(
            "run %s: the rank group of stage %r (attempt %s) ended since its last order: %s; "
            "starting a new one",
            run.run_id,
            name,
            group.rendezvous.attempt,
            "; ".join(end.message or f"node {end.node_rank} {end.kind}" for end in group.ends()),
        )
    group = Attempt(config, run, iteration, name, pool)
    _groups[key] = (group, iteration)
    return group


def close_rank_groups(run: RunRef) -> None:
    """Stop this flow run's rank groups of ``run`` (the flow run ends), waiting for their
    nodes to end: the pool's workers are free for the next flow run."""
    for key in [key for key in _groups if key[:2] == (run, current_flow_run())]:
        group, iteration = _groups.pop(key)
        group.stop(iteration)


KEEP, RELEASE, END = "keep", "release", "end"


def between_orders(config: Any, name: str, pool: str | None) -> str:
    """What a warm group of stage ``name`` does with what it holds between orders:

    - ``END``: the group ends after each order, where other stages need the workers of its
      pool (another stage is placed there too);
    - ``RELEASE``: one machine's ranks on GPUs, which the flow's generation and inference
      stages share: they stay up and move their weights and optimizer state to host memory
      after each order (``RunRuntime.release_devices``), as NeMo RL's colocated workers do
      between steps;
    - ``KEEP``: the group keeps everything resident (devices of its own, or only CPUs).
    """
    if pool is not None:
        shared = any(p == pool and stage != name for stage, p in config.cluster.placement.items())
        return END if shared else KEEP
    return RELEASE if torch.cuda.is_available() else KEEP


def run_placed_nodes(
    config: Any,
    run: RunRef,
    iteration: int,
    name: str,
    pool: str | None,
    upstream: dict[str, StageRef],
    inputs: dict[str, str],
) -> StageRef:
    """Stage ``name`` across ``cluster.num_nodes`` nodes of ``pool``, or this machine's ranks
    (``pool`` None; see the module docstring), ordered from the training stage's rank group
    (every stage on the training ranks runs there, with its models loaded beside the trained
    one's, as NeMo RL colocates a teacher with its student); its committed outputs."""
    storage = open_storage(run)
    watch = PoolWatch.of(pool) if pool is not None else None
    attempts = int(STAGE_TASK_OPTIONS["retries"]) + 1
    restartable: list[NodeEnd] = []
    where = f"stage {name!r} of iteration {iteration} {on_pool(pool)}"
    key = (run, current_flow_run(), TRAIN_STAGE)
    try:
        for number in range(1, attempts + 1):
            group = warm_group(config, run, iteration, TRAIN_STAGE, pool, watch)
            # a group whose step raises stays registered: the flow run's end stops it
            ordered = group.step(iteration, upstream, watch, name)
            if ordered:
                if between_orders(config, TRAIN_STAGE, pool) == END:
                    # other stages need its workers or GPUs before the next iteration
                    del _groups[key]
                    group.stop(iteration)
                else:
                    _groups[key] = (group, iteration)  # kept warm for the next iteration
                if (ref := stored_stage(storage, iteration, name, inputs)) is None:
                    raise PlacementError(f"{where}: its order completed, rank 0 committed nothing")
                return ref
            del _groups[key]
            group.wait(watch)
            group.cancel_orders("its rank group ended")
            ends = group.ends()
            unstarted = group.unstarted(ends)
            ends = [end for end in ends if end.node_rank not in unstarted]
            if not unstarted and all(end.kind == "finished" for end in ends):
                # the group stopped on its own (no order for its idle_s) as the order came
                restartable = [
                    NodeEnd(
                        end.node_rank,
                        end.kind,
                        f"{group.node_label(end.node_rank)}: "
                        "its rank group stopped before the order reached it",
                    )
                    for end in ends
                ]
            else:
                restartable = [end for end in ends if end.restartable]
                failed = [end for end in ends if end.kind == "failed"]
                if failed and not restartable:
                    raise RanksFailed(f"{where}: " + "; ".join(end.message for end in failed))
                if unstarted and not any(end.kind == "lost" for end in ends):
                    raise PlacementError(
                        f"{where}: node(s) {unstarted} were not started by a worker of the pool "
                        "(it serves fewer nodes than cluster.num_nodes at once): "
                        + "; ".join(end.message for end in restartable or failed)
                    )
            if number < attempts:
                stage_logger().warning(
                    "run %s: stage %r of iteration %d, attempt %d of %d: %s; running it again "
                    "with every rank restarted",
                    run.run_id,
                    name,
                    iteration,
                    number,
                    attempts,
                    "; ".join(end.message for end in restartable),
                )
    finally:
        if watch is not None:
            watch.settle()
    raise PlacementError(
        f"{where}: {attempts} attempts lost "
        "a rank or node, or did not all meet; the last: "
        + "; ".join(end.message for end in restartable)
    )
