"""A node of a rank group whose peer never joins: torchrun's c10d rendezvous (``--nnodes 2``,
127.0.0.1) gives up after ``join_timeout_s`` and names the node that never came. The node
runs the program a pool's worker starts for it (``flows.rank_group``), which never starts:
the rendezvous ends first. The training itself across nodes, a lost rank and a pool short of
workers are tested through the flow (tests/flows/test_placed_nodes_flow.py)."""

import time
from dataclasses import replace
from pathlib import Path

import pytest

from flows.pool_tasks import rank_group_key, rank_group_program
from flows.rank_group import idle_seconds
from nemo_rl_core.distributed.node_launch import (
    Rendezvous,
    RendezvousIncomplete,
    RendezvousNotes,
    launch_node,
)
from nemo_rl_core.storage.handles import RunRef, open_storage

pytestmark = [pytest.mark.distributed]


def launch_alone(run: RunRef, node_rank: int, plan: Rendezvous) -> None:
    """Node ``node_rank`` of ``plan``, a group's node as a pool's worker launches it."""
    program = rank_group_program(run, rank_group_key("pool", plan.attempt), idle_seconds())
    notes = RendezvousNotes(open_storage(run), 0, "train", plan.attempt)
    launch_node(program, node_rank, plan, notes)


def test_a_node_that_never_joins_fails_the_rendezvous_naming_it(tmp_path: Path) -> None:
    run = RunRef(str(tmp_path), "alone")
    # the shortest timeout torchrun takes (whole seconds): the peer never comes anyway
    plan = Rendezvous("alone-attempt", 2, 1, join_timeout_s=1, host="127.0.0.1")
    started = time.monotonic()
    with pytest.raises(RendezvousIncomplete, match=r"node\(s\) \[1\] never joined \(1 of world"):
        launch_alone(run, 0, plan)
    assert time.monotonic() - started < 1 + 30
    # a node whose node 0 never comes waits as long, then names node 0
    with pytest.raises(RendezvousIncomplete, match=r"node\(s\) \[0\] never joined"):
        launch_alone(run, 1, replace(plan, attempt="alone-late"))
