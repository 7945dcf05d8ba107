"""A warm rank group: one torchrun per node whose ranks stay up for every iteration of one
flow run's stage across processes (``flows.placed_nodes``), so that an iteration pays its step,
not a torchrun launch and a model load on every rank.

``python -m flows.rank_group`` is what torchrun starts on every rank of a group (the node
task a pool's stage worker runs: ``flows.pool_tasks.run_node_here``; for this machine's
ranks, the flow's own process: ``flows.local_node``). Each rank joins the
world (``init_rank``) and opens the run's runtime; then

- rank 0 is a Prefect task worker (``StageTaskWorker``) of the group's own task key
  (``rank_group_key``): the iteration flow orders each iteration's stage as one task run of
  that key (``Task.apply_async``), and the group's end with one more;
- rank 0's task run hands its order to every rank (``broadcast_object_list`` on a gloo group
  whose timeout covers the wait between orders), every rank runs its part of the stage
  (``tasks.spmd_rank.run_rank_stage``: rank 0 commits it, under the stage's
  ``orchestration.stage_timeout_seconds``), and the task run completes once all are done;
- the weights stay loaded between orders: the runtime knows which step it holds
  (``RunRuntime.policy_for_update``), as the one-process flow's does; ranks on GPUs the
  flow's own stages share (``--release-devices``) keep them in host memory in between.

An order that raises on a rank ends that rank, and through the collectives its peers wait in,
every rank: the group is gone, the order's task run failed, and the flow starts a new group
(a new attempt) or fails the stage. A flow run that died without stopping
its group leaves it idle: rank 0 stops it once Prefect holds that flow run ended (asked
every ``FLOW_RUN_CHECK_S``: a work pool's worker marks a flow run whose process died
``Crashed``), or once no order came for its idle time, freeing its stage workers. The idle
time is the flow's (``idle_seconds``: ``NEMO_RL_CORE_RANK_GROUP_IDLE_S`` in its environment,
1800 s by default), handed to the ranks as it starts them (``--idle-s``).
"""

import argparse
import asyncio
import contextlib
import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from typing import Any
from uuid import UUID

import torch.distributed as dist
from prefect import Task, task
from prefect.client.orchestration import get_client
from torch.distributed.elastic.multiprocessing.errors import record

from flows.pool_tasks import within_stage_timeout
from flows.stage_worker import StageTaskWorker, worker_clients
from nemo_rl_core.distributed.world import init_rank
from nemo_rl_core.pipeline.context import StageRef
from nemo_rl_core.pipeline.runtime import close_runtime, runtime_for
from nemo_rl_core.storage.handles import RunRef
from tasks.spmd_rank import COLLECTIVE_TIMEOUT_S, run_rank_stage
from tasks.stage import STAGE_TASK_OPTIONS

IDLE_ENV = "NEMO_RL_CORE_RANK_GROUP_IDLE_S"
DEFAULT_IDLE_S = 1800.0
FLOW_RUN_CHECK_S = 5.0  # how often an idle group asks whether its flow run has ended
ORDERS_MARGIN_S = 120.0  # the other ranks wait this much longer for an order than rank 0
POLL_S = 0.2
STAGE, STOP = "stage", "stop"  # what an order asks: run the stage, or end the group

log = logging.getLogger("nemo_rl_core.rank_group")


def idle_seconds() -> float:
    """How long a group waits for its next order before it stops on its own:
    ``NEMO_RL_CORE_RANK_GROUP_IDLE_S`` in the environment of the flow that starts it, or
    ``DEFAULT_IDLE_S``."""
    value = os.environ.get(IDLE_ENV, str(DEFAULT_IDLE_S))
    try:
        seconds = float(value)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds < math.inf:
        raise ValueError(
            f"{IDLE_ENV}={value!r}: the seconds a rank group waits for its next order before "
            f"it stops, a number above 0 (default {DEFAULT_IDLE_S:g})"
        )
    return seconds


@dataclass(frozen=True)
class Order:
    """What rank 0 hands every rank: run stage ``name`` of ``iteration`` from ``upstream``
    (``kind`` STAGE), or end the group (``kind`` STOP)."""

    kind: str
    iteration: int
    name: str
    upstream: dict[str, StageRef]


def exchange(order: Order | None, orders: dist.ProcessGroup) -> Order:
    """Rank 0's ``order``, on every rank (rank 0 passes it, the others None)."""
    box: list[Any] = [order]
    dist.broadcast_object_list(box, src=0, group=orders)
    return box[0]


class OrderServer:
    """Rank 0's side of a group: carries out the orders its task runs bring, one at a time,
    and stops the group when told to, when an order fails, or (``stop_unless_busy``) when
    none came for ``idle_s`` or its flow run ended."""

    def __init__(
        self, run: RunRef, orders: dist.ProcessGroup, idle_s: float, release_devices: bool
    ) -> None:
        self.run, self.orders, self.idle_s = run, orders, idle_s
        self.release_devices = release_devices
        self.lock = threading.Lock()  # one order on the wire at a time
        self.done = threading.Event()
        self.failure: BaseException | None = None
        self.last_order_at = time.monotonic()

    def carry_out(self, order: Order) -> None:
        with self.lock:
            self.last_order_at = time.monotonic()
            if self.done.is_set():
                raise RuntimeError(
                    f"rank group of run {self.run.run_id}: {order.kind} order for stage "
                    f"{order.name!r} of iteration {order.iteration} came after the group stopped"
                )
            try:
                exchange(order, self.orders)
                if order.kind == STOP:
                    self.done.set()
                    return
                within_stage_timeout(
                    self.run,
                    order.name,
                    lambda: run_order(self.run, order, self.release_devices),
                )
            except BaseException as err:
                self.failure = err  # ends rank 0, once its task run has said so
                self.done.set()
                raise
            finally:
                self.last_order_at = time.monotonic()

    def stop_unless_busy(self, why: str) -> None:
        """Stop the group (``why``: for the log) unless an order is being carried out."""
        if not self.lock.acquire(blocking=False):
            return
        try:
            if not self.done.is_set():
                log.warning("rank group of run %s: %s; stopping", self.run.run_id, why)
                exchange(Order(STOP, -1, "", {}), self.orders)
                self.done.set()
        finally:
            self.lock.release()


_server: OrderServer | None = None  # rank 0's, in a group's rank 0 process only


def order_ranks(
    run: RunRef, iteration: int, name: str, upstream: dict[str, StageRef], kind: str
) -> None:
    """One order to a warm rank group (the task its rank 0 serves): run stage ``name`` of
    ``iteration`` from ``upstream`` on every rank (``kind`` STAGE), or end the group (STOP)."""
    if _server is None or _server.run != run:
        raise RuntimeError(
            f"an order to a rank group of run {run.run_id} runs in that group's rank 0 only "
            "(python -m flows.rank_group, started by the run's node tasks or its flow)"
        )
    _server.carry_out(Order(kind, iteration, name, upstream))


@cache
def rank_group_task(key: str) -> Task[..., None]:
    """The order task of the group serving ``key`` (``flows.pool_tasks.rank_group_key``):
    what its rank 0 serves and the iteration flow submits. Never retried by Prefect: a
    failed order ended the group, and the flow decides what runs next."""
    options = {**STAGE_TASK_OPTIONS, "retries": 0, "task_run_name": "{name}-{kind}-it{iteration}"}
    order = task(name="stage-ranks", **options)(order_ranks)
    order.task_key = key
    return order


async def flow_run_ended(flow_run: str | None) -> str | None:
    """How ``flow_run`` ended (``Crashed``), or None while it runs (or is unknown)."""
    if flow_run is None:
        return None
    async with get_client() as client:
        state = (await client.read_flow_run(UUID(flow_run))).state
    return state.name if state is not None and state.is_final() else None


async def serve_orders(server: OrderServer, key: str, flow_run: str | None) -> None:
    """Rank 0: take the group's orders (task runs of ``key``) until the group stops (told
    to, or its flow run ``flow_run`` ended, or idle); an order's error, raised again here,
    ends rank 0 (torchrun records it for its node)."""
    global _server
    _server = server
    async with worker_clients():
        worker = StageTaskWorker([rank_group_task(key)], f"rank group {key!r}")
        serving = asyncio.create_task(worker.astart())
        checked_at = time.monotonic()
        while not server.done.is_set() or any(worker.in_flight_task_runs.values()):
            if serving.done():
                serving.result()
                raise RuntimeError(f"rank group {key!r}: its task worker stopped serving")
            if time.monotonic() - server.last_order_at >= server.idle_s:
                server.stop_unless_busy(f"no order for {server.idle_s:g} s")
            if time.monotonic() - checked_at >= FLOW_RUN_CHECK_S:
                checked_at = time.monotonic()
                if (ended := await flow_run_ended(flow_run)) is not None:
                    server.stop_unless_busy(f"its flow run {flow_run} is {ended}")
            await asyncio.sleep(POLL_S)
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    if server.failure is not None:
        raise server.failure


def run_order(run: RunRef, order: Order, release_devices: bool) -> None:
    """This rank's part of a STAGE order; with ``release_devices`` its models then leave
    the GPU for host memory until the next order (``flows.placed_nodes.between_orders``)."""
    run_rank_stage(run, order.iteration, order.name, order.upstream)
    if release_devices:
        runtime_for(run).release_devices()


def follow_orders(run: RunRef, orders: dist.ProcessGroup, release_devices: bool) -> None:
    """Every rank but 0: carry out rank 0's orders until it says stop."""
    while (order := exchange(None, orders)).kind != STOP:
        run_order(run, order, release_devices)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="one rank of a warm rank group")
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--storage-root", required=True)
    parser.add_argument("--orders", required=True, help="the task key rank 0 serves")
    parser.add_argument("--flow-run", default=None, help="the flow run that ordered it")
    parser.add_argument(
        "--idle-s", type=float, required=True, help="stop after this long without an order"
    )
    parser.add_argument(
        "--release-devices",
        action="store_true",
        help="move the models to host memory after each order (ranks on GPUs the flow shares)",
    )
    return parser


@record
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    init_rank(COLLECTIVE_TIMEOUT_S)
    orders_timeout = timedelta(seconds=args.idle_s + ORDERS_MARGIN_S)
    orders = dist.new_group(backend="gloo", timeout=orders_timeout)
    run = RunRef(args.storage_root, args.run_id)
    runtime_for(run)
    if dist.get_rank() == 0:
        server = OrderServer(run, orders, args.idle_s, args.release_devices)
        asyncio.run(serve_orders(server, args.orders, args.flow_run))
    else:
        follow_orders(run, orders, args.release_devices)
    close_runtime(run)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
