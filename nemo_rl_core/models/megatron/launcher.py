"""Where the Megatron ranks run: in this process (world size 1), as this process's rank of a
stage run across processes (a rank of ``flows.rank_group``: every rank runs the same stage),
or, for a model held by a one-process stage, under ``torchrun --standalone``.

All give the same ``WorkerGroup.run(method, *args)``: call ``MegatronWorker.method`` on
every rank with the same arguments and return the results of the ranks that hold them
(tensor-parallel rank 0 of each data-parallel rank, in data-parallel order). Across a
stage's ranks the results are gathered with a torch.distributed collective. Under
``--standalone`` a driver in the stage's process listens on a local socket; each rank
connects, receives the ``WorkerSpec`` and then serves calls until told to stop
(``python -m nemo_rl_core.models.megatron.launcher`` is that rank's entry point): what is
left of it serves the stages that read a Megatron policy with TP x DP > 1 without training
it (logprob, reference logprobs, validation), in the flow's process.
"""

import contextlib
import os
import pickle
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any, Protocol

import torch

from nemo_rl_core.distributed.world import is_distributed
from nemo_rl_core.models.megatron.worker import MegatronWorker, WorkerSpec
from nemo_rl_core.utils.cpu_cores import omp_threads_per_rank
from nemo_rl_core.utils.process_exit import skip_final_collections

DRIVER_ADDRESS_ENV = "NEMO_RL_MEGATRON_DRIVER"
DRIVER_KEY_ENV = "NEMO_RL_MEGATRON_KEY"
START_TIMEOUT_S = 600.0
_STOP = "__stop__"


def _send(conn: Connection, obj: Any) -> None:
    """Plain pickle: torch registers shared-memory reducers on multiprocessing's pickler,
    which would hand tensors over as file descriptors the other process cannot open."""
    conn.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


class WorkerError(RuntimeError):
    """A Megatron rank failed; the message carries its traceback."""


class WorkerGroup(Protocol):
    world_size: int

    def run(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...

    def shutdown(self) -> None: ...


class InProcessWorkers:
    """World size 1: the rank is this process (torch.distributed with one gloo/nccl rank)."""

    world_size = 1

    def __init__(self, spec: WorkerSpec) -> None:
        self.worker: MegatronWorker | None = MegatronWorker(spec)

    def run(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        if self.worker is None:
            raise RuntimeError("the Megatron worker was shut down")
        return [getattr(self.worker, method)(*args, **kwargs)]

    def shutdown(self) -> None:
        self.worker = None


class RankWorkers:
    """This process is one rank of a stage run across processes: its worker is local, and
    every call's results are gathered from all ranks (``all_gather_object``)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.world_size = torch.distributed.get_world_size()
        cfg = spec.megatron_cfg
        tp, dp = cfg.tensor_model_parallel_size, cfg.data_parallel_size
        if self.world_size % tp or dp not in (1, self.world_size // tp):
            raise ValueError(
                f"megatron_cfg.tensor_model_parallel_size={tp} x data_parallel_size={dp} does "
                f"not fit the training stage's {self.world_size} ranks (cluster.num_nodes x "
                "cluster.gpus_per_node): the data-parallel size is the ranks over TP; leave "
                "data_parallel_size at 1 or set it to that"
            )
        self.worker = MegatronWorker(spec)

    def run(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        result = getattr(self.worker, method)(*args, **kwargs)
        gathered: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(gathered, (self.worker.result_rank(), result))
        return [value for keep, value in gathered if keep]

    def shutdown(self) -> None:
        """The stage program ends the process group when the stage is done."""


class TorchrunWorkers:
    """``world_size`` ranks started by ``torchrun --standalone`` and driven over local sockets."""

    def __init__(self, spec: WorkerSpec, world_size: int) -> None:
        self.world_size = world_size
        authkey = secrets.token_bytes(32)
        self._listener = Listener(("127.0.0.1", 0), authkey=authkey)
        host, port = self._listener.address
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the ranks
            prefix="megatron_ranks_", suffix=".log", delete=False
        )
        env = {
            **os.environ,
            DRIVER_ADDRESS_ENV: f"{host}:{port}",
            DRIVER_KEY_ENV: authkey.hex(),
            "OMP_NUM_THREADS": omp_threads_per_rank(world_size),
        }
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world_size}",
            "-m",
            "nemo_rl_core.models.megatron.launcher",
        ]
        self._proc = subprocess.Popen(command, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self._conns: list[Connection] = self._accept_ranks()
        self._broadcast(("__init__", (spec,), {}))

    def _accept_ranks(self) -> list[Connection]:
        conns: dict[int, Connection] = {}

        def accept() -> None:
            while len(conns) < self.world_size:
                conn = self._listener.accept()
                conns[_recv(conn)] = conn

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while thread.is_alive():
            thread.join(0.2)
            self._check_alive()
            if time.monotonic() > deadline:
                self.shutdown()
                raise WorkerError(f"Megatron ranks did not connect in {START_TIMEOUT_S}s")
        return [conns[rank] for rank in range(self.world_size)]

    def _check_alive(self) -> None:
        if self._proc.poll() is not None:
            raise WorkerError(
                f"torchrun exited with code {self._proc.returncode}; last output:\n{self.log_tail()}"
            )

    def log_tail(self, chars: int = 4000) -> str:
        return Path(self._log.name).read_text(errors="replace")[-chars:]

    def _broadcast(self, message: tuple[str, tuple, dict]) -> list[Any]:
        for conn in self._conns:
            _send(conn, message)
        replies = []
        for rank, conn in enumerate(self._conns):
            while not conn.poll(0.2):
                self._check_alive()
            status, payload = _recv(conn)
            if status == "error":
                raise WorkerError(f"Megatron rank {rank} failed in {message[0]}:\n{payload}")
            replies.append(payload)
        return replies

    def run(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        replies = self._broadcast((method, args, kwargs))
        return [result for keep, result in replies if keep]

    def shutdown(self) -> None:
        if self._proc.poll() is None:
            for conn in getattr(self, "_conns", []):
                with contextlib.suppress(OSError):
                    _send(conn, (_STOP, (), {}))
            try:
                self._proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._proc.terminate()
                self._proc.wait(timeout=30)
        self._listener.close()


def launch(spec: WorkerSpec) -> WorkerGroup:
    """Ranks for ``spec``: this process's rank of a stage's world, else tensor x data
    parallel size of ``policy.megatron_cfg`` ranks."""
    if is_distributed():
        return RankWorkers(spec)
    cfg = spec.megatron_cfg
    world_size = cfg.tensor_model_parallel_size * cfg.data_parallel_size
    if world_size == 1:
        return InProcessWorkers(spec)
    return TorchrunWorkers(spec, world_size)


def serve() -> None:
    """Rank entry point: connect to the driver, build the worker, answer calls until stopped."""
    skip_final_collections()
    host, port = os.environ[DRIVER_ADDRESS_ENV].rsplit(":", 1)
    conn = Client((host, int(port)), authkey=bytes.fromhex(os.environ[DRIVER_KEY_ENV]))
    _send(conn, int(os.environ["RANK"]))
    worker: MegatronWorker | None = None
    while True:
        method, args, kwargs = _recv(conn)
        if method == _STOP:
            break
        try:
            if method == "__init__":
                worker = MegatronWorker(*args, **kwargs)
                _send(conn, ("ok", (False, None)))
                continue
            if worker is None:
                raise RuntimeError(f"{method} was called before __init__")
            result = getattr(worker, method)(*args, **kwargs)
            _send(conn, ("ok", (worker.result_rank(), result)))
        except Exception:  # noqa: BLE001 - the traceback goes to the driver, which raises
            _send(conn, ("error", traceback.format_exc()))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    serve()
