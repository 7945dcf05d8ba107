"""One node's ranks of a stage, started with torch's own launcher (torchrun, c10d rendezvous).

A stage wider than one process runs SPMD: every rank runs the same program, joined into one
torch.distributed world by torchrun's elastic rendezvous. ``launch_node`` starts one node's
share of the ranks and returns when they end; the nodes of one attempt are launched
separately (one call per machine, each from a worker of the stage's pool) with the same
``Rendezvous``:

- ``attempt`` names the attempt: it is torchrun's ``--rdzv-id``, so every node of an attempt
  passes the same one, and a retry passes a new one (it restarts every rank, on every node);
- ``endpoint`` is the c10d store's ``HOST:PORT``. Left out, node 0 hosts the store on a free
  port of its machine and publishes ``HOST:PORT`` on the run's storage, where the other
  nodes wait for it (``RendezvousNotes``); every node notes there that it joined;
- ``join_timeout_s`` is how long the rendezvous waits for all ``nnodes``: past it every
  node that came fails with ``RendezvousIncomplete``, naming the nodes that never joined.

With one node it is ``torchrun --standalone``. A rank that fails ends its node's other
ranks (torchrun's ``--max-restarts 0``) and, through the collectives they wait in, the
other nodes' ranks: every node's launch raises, naming its failed ranks: ``RanksLost`` for
a rank killed by a signal (a lost process or machine: run the attempt again),
``RanksFailed`` for one that raised (its traceback in the message). Each node also notes how
it ended (``RendezvousNotes.end``), for whoever waits on the nodes of an attempt from another
process to decide whether to run the attempt again.
"""

import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch

from nemo_rl_core.distributed.launcher_death import LAUNCHER_PID_ENV
from nemo_rl_core.distributed.virtual_cluster import training_world
from nemo_rl_core.storage.run_storage import RunStorage
from nemo_rl_core.utils.cpu_cores import omp_threads_per_rank, usable_cpu_cores

POLL_S = 0.5
LOG_TAIL_CHARS = 3000
STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class Rendezvous:
    """How the nodes of one attempt of a stage find each other (see the module docstring).
    ``host``: the address node 0 publishes for its store (default: its host name)."""

    attempt: str
    nnodes: int
    nproc_per_node: int
    join_timeout_s: float = 600.0
    endpoint: str | None = None
    host: str | None = None

    @property
    def world_size(self) -> int:
        return self.nnodes * self.nproc_per_node

    @classmethod
    def for_cluster(cls, config: Any, attempt: str, host: str | None = None) -> "Rendezvous":
        """The training stage's rendezvous as the config's ``cluster:`` asks for it: its
        nodes and ranks per node, ``rendezvous_timeout_seconds``, ``rendezvous_endpoint``."""
        nodes, per_node = training_world(config)
        cluster = config.cluster
        return cls(
            attempt,
            nodes,
            per_node,
            join_timeout_s=cluster.rendezvous_timeout_seconds,
            endpoint=cluster.rendezvous_endpoint,
            host=host,
        )


class RendezvousNotes:
    """What the nodes of one attempt tell each other through the run's storage: the
    endpoint node 0 hosts, and which nodes joined."""

    def __init__(self, storage: RunStorage, iteration: int, stage: str, attempt: str) -> None:
        self.storage, self.iteration, self.stage, self.attempt = storage, iteration, stage, attempt

    def _write(self, note: str, record: dict[str, Any]) -> None:
        self.storage.write_rendezvous_note(self.iteration, self.stage, self.attempt, note, record)

    def _read(self, note: str) -> dict[str, Any] | None:
        return self.storage.read_rendezvous_note(self.iteration, self.stage, self.attempt, note)

    def publish_endpoint(self, endpoint: str) -> None:
        self._write("endpoint", {"endpoint": endpoint})

    def endpoint(self) -> str | None:
        record = self._read("endpoint")
        return None if record is None else str(record["endpoint"])

    def mark_joined(self, node_rank: int) -> None:
        self._write(f"node-{node_rank}", {"host": socket.gethostname(), "pid": os.getpid()})

    def joined(self, nnodes: int) -> list[int]:
        return [node for node in range(nnodes) if self._read(f"node-{node}") is not None]

    def record_end(self, node_rank: int, error: Exception | None) -> None:
        """Note how node ``node_rank``'s launch ended: finished (``error`` None), or how."""
        kinds = [kind for cls, kind in NodeEnd.KINDS.items() if isinstance(error, cls)]
        kind = kinds[0] if kinds else "finished"
        self._write(f"end-{node_rank}", {"kind": kind, "message": str(error or "")})

    def end(self, node_rank: int) -> "NodeEnd | None":
        """How node ``node_rank``'s launch ended, or None (it did not end, or never launched)."""
        record = self._read(f"end-{node_rank}")
        return None if record is None else NodeEnd(node_rank, record["kind"], record["message"])


@dataclass(frozen=True)
class RankFailure:
    """One rank that ended badly: its global rank, exit code (negative: the signal that
    killed it) and the message torchrun recorded (a raised error's traceback)."""

    rank: int
    exitcode: int
    message: str

    @property
    def killed(self) -> bool:
        return self.exitcode < 0

    def __str__(self) -> str:
        if self.killed:
            how = f"was killed by {signal.Signals(-self.exitcode).name}"
        else:
            how = f"exited with code {self.exitcode}: {self.message}"
        return f"rank {self.rank} {how}"


class RanksFailed(RuntimeError):
    """A rank of the stage raised; every rank of the attempt ended."""


class RanksLost(ConnectionError):
    """A rank of the stage was killed (a lost process or machine); every rank of the attempt
    ended, and an attempt run again restarts them all."""


class RendezvousIncomplete(TimeoutError):
    """The stage's ranks did not all join within the rendezvous's ``join_timeout_s``."""


class AttemptEnded(RendezvousIncomplete):
    """This node started after another node of its attempt had ended (its worker was busy
    until then): it joined nothing."""


@dataclass(frozen=True)
class NodeEnd:
    """How one node's launch ended: ``finished``, or the error it raised (``lost``:
    ``RanksLost``, ``late``: ``AttemptEnded``, ``incomplete``: ``RendezvousIncomplete``,
    ``failed``: ``RanksFailed``)."""

    KINDS: ClassVar[dict[type[Exception], str]] = {  # the first that matches names it
        RanksLost: "lost",
        AttemptEnded: "late",
        RendezvousIncomplete: "incomplete",
        RanksFailed: "failed",
    }
    node_rank: int
    kind: str
    message: str

    @property
    def restartable(self) -> bool:
        """Whether running the attempt again, every rank restarted, may succeed: a rank or
        node was lost, or the nodes never all met; not when a rank raised."""
        return self.kind in ("lost", "incomplete")


def launch_node(
    program: Sequence[str],
    node_rank: int,
    rendezvous: Rendezvous,
    notes: RendezvousNotes,
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
) -> None:
    """Start node ``node_rank``'s ranks of ``rendezvous`` running ``program`` (``python``'s
    arguments, e.g. ``["-m", "pkg.module", ...]``) and wait for them; raises as the module
    docstring says. The node's output (torchrun's and its ranks') goes to ``log_path``."""
    if not 0 <= node_rank < rendezvous.nnodes:
        raise ValueError(f"node_rank {node_rank} is not one of the {rendezvous.nnodes} nodes")
    try:
        _run_node(program, node_rank, rendezvous, notes, env, log_path)
    except (RanksLost, RendezvousIncomplete, RanksFailed) as err:
        notes.record_end(node_rank, err)
        raise
    notes.record_end(node_rank, None)


def _run_node(
    program: Sequence[str],
    node_rank: int,
    rendezvous: Rendezvous,
    notes: RendezvousNotes,
    env: Mapping[str, str] | None,
    log_path: Path | None,
) -> None:
    _check_fits(node_rank, rendezvous)
    _check_attempt_open(node_rank, rendezvous, notes)
    scratch = Path(tempfile.mkdtemp(prefix=f"node{node_rank}-{rendezvous.attempt}-"))
    summary = scratch / "summary.json"
    log_path = log_path or scratch / "node.log"
    notes.mark_joined(node_rank)
    command = [
        sys.executable,
        "-m",
        "nemo_rl_core.distributed.node_agent",
        str(summary),
        *_torchrun_args(node_rank, rendezvous, notes),
        *program,
    ]
    rank_env = {
        **os.environ,
        "OMP_NUM_THREADS": omp_threads_per_rank(rendezvous.nproc_per_node),
        **(env or {}),
        LAUNCHER_PID_ENV: str(os.getpid()),
    }
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            command, env=rank_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            returncode = process.wait()
        finally:
            _stop(process)
    if returncode != 0:
        raise _failure(node_rank, rendezvous, notes, summary, log_path)


def _check_attempt_open(node_rank: int, rendezvous: Rendezvous, notes: RendezvousNotes) -> None:
    """A node started after another node of its attempt ended (its worker was busy until
    then) joins nothing: the attempt is over, and its store may be gone."""
    others = [node for node in range(rendezvous.nnodes) if node != node_rank]
    ended = [end for node in others if (end := notes.end(node)) is not None]
    if ended:
        raise AttemptEnded(
            f"{_label(notes)}, node {node_rank} of {rendezvous.nnodes}: started after "
            f"node(s) {[end.node_rank for end in ended]} of the attempt had ended; not joined"
        )


def _check_fits(node_rank: int, rendezvous: Rendezvous) -> None:
    """A node's ranks need a GPU each where there is CUDA, else a core each."""
    per_node = rendezvous.nproc_per_node
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    have, what = (gpus, "GPUs") if gpus else (usable_cpu_cores(), "cores (no CUDA)")
    if per_node > have:
        raise RanksFailed(
            f"node {node_rank} of {rendezvous.nnodes} (host {socket.gethostname()}): "
            f"{per_node} ranks per node (cluster.gpus_per_node) need {per_node} {what}, this "
            f"machine has {have}; give the pool machines that size, or lower gpus_per_node"
        )


def _torchrun_args(node_rank: int, rendezvous: Rendezvous, notes: RendezvousNotes) -> list[str]:
    sizes = [f"--nnodes={rendezvous.nnodes}", f"--nproc-per-node={rendezvous.nproc_per_node}"]
    if rendezvous.nnodes == 1:
        return ["--standalone", *sizes, "--max-restarts=0"]
    conf = f"join_timeout={math.ceil(rendezvous.join_timeout_s)}"
    endpoint = rendezvous.endpoint
    if endpoint is None:
        endpoint = _published_endpoint(node_rank, rendezvous, notes)
        conf += f",is_host={str(node_rank == 0).lower()}"
    return [
        *sizes,
        f"--node-rank={node_rank}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={rendezvous.attempt}",
        f"--rdzv-conf={conf}",
        "--max-restarts=0",
    ]


def _published_endpoint(node_rank: int, rendezvous: Rendezvous, notes: RendezvousNotes) -> str:
    """Node 0: a free port of this machine, published; the others: what node 0 published."""
    if node_rank == 0:
        host = rendezvous.host or socket.gethostname()
        with socket.socket() as probe:
            probe.bind(("", 0))
            endpoint = f"{host}:{probe.getsockname()[1]}"
        notes.publish_endpoint(endpoint)
        return endpoint
    deadline = time.monotonic() + rendezvous.join_timeout_s
    while (published := notes.endpoint()) is None:
        if time.monotonic() > deadline:
            raise _never_joined(
                f"{_label(notes)}, node {node_rank} of {rendezvous.nnodes}",
                rendezvous,
                notes,
                "node 0 never published the endpoint of the store it hosts",
            )
        time.sleep(POLL_S)
    return published


def _never_joined(
    label: str, rendezvous: Rendezvous, notes: RendezvousNotes, detail: str
) -> RendezvousIncomplete:
    missing = sorted(set(range(rendezvous.nnodes)) - set(notes.joined(rendezvous.nnodes)))
    per_node = rendezvous.nproc_per_node
    return RendezvousIncomplete(
        f"{label}: the rendezvous of {rendezvous.nnodes} nodes x {per_node} ranks did not "
        f"complete within join_timeout={rendezvous.join_timeout_s:g}s; node(s) {missing} "
        f"never joined ({len(missing) * per_node} of world size {rendezvous.world_size} "
        f"ranks missing). {detail}"
    )


def _stop(process: subprocess.Popen) -> None:
    """End the node's agent and ranks if this launch ends first (a stage timeout)."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _label(notes: RendezvousNotes) -> str:
    return f"stage {notes.stage!r} of iteration {notes.iteration} (attempt {notes.attempt})"


def _failure(
    node_rank: int,
    rendezvous: Rendezvous,
    notes: RendezvousNotes,
    summary_path: Path,
    log_path: Path,
) -> Exception:
    label = f"{_label(notes)}, node {node_rank} of {rendezvous.nnodes}"
    log = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if "rendezvous" in summary:
        return _never_joined(label, rendezvous, notes, f"torchrun: {summary['rendezvous']}")
    failures = [
        RankFailure(item["rank"], item["exitcode"], item["message"])
        for item in summary.get("failures", [])
    ]
    if not failures:
        return RanksFailed(f"{label}: torchrun failed; its output ({log_path}):\n{log}")
    listed = "; ".join(str(failure) for failure in failures)
    cls = RanksLost if any(failure.killed for failure in failures) else RanksFailed
    return cls(f"{label}: {listed} (every rank of the attempt ended; output: {log_path})")
