"""Drive the real local stack (PostgreSQL, Prefect server, workers, moto S3) from Python:
the stack tests' fixture and the soak benchmark.

``start_stack``/``stop_stack`` wrap ``infra/stack.sh`` for a state dir of its own on free
ports; ``LocalStack`` holds where it listens and runs CLI and API calls against it.
"""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.listing import PAGE, every_entry

PROJECT_ROOT = Path(__file__).resolve().parents[1]
STACK_SH = PROJECT_ROOT / "infra" / "stack.sh"
FINAL_STATES = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def wait_for_text(read_logs: Callable[[], list[str]], text: str, timeout: float = 60) -> list[str]:
    """The log messages ``read_logs`` gives once one contains ``text``: a process sends its
    logs to the server in batches, some after its flow run's final state."""
    deadline = time.monotonic() + timeout
    while True:
        logs = read_logs()
        if any(text in message for message in logs):
            return logs
        if time.monotonic() > deadline:
            raise AssertionError(f"no log containing {text!r} after {timeout:.0f} s: {logs}")
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _read_env_file(env_file: Path) -> dict[str, str]:
    """The variables ``env_file`` exports, as bash sees them."""
    out = subprocess.run(
        ["bash", "-c", 'set -a; source "$1"; env -0', "-", str(env_file)],
        env={"PATH": os.environ["PATH"]},
        check=True,
        capture_output=True,
    ).stdout.decode()
    env = dict(line.split("=", 1) for line in out.split("\0") if "=" in line)
    return {k: v for k, v in env.items() if k not in {"PATH", "PWD", "SHLVL", "_"}}


@dataclass(frozen=True)
class LocalStack:
    """Where the stack listens, and helpers to drive it the way a user would."""

    state_dir: Path
    ports: dict[str, int]
    # what .infra/env.sh exports and the settings it started with: give these to any client
    env_vars: dict[str, str]

    @property
    def env(self) -> dict[str, str]:
        """The test process's environment plus the stack's, venv first on PATH: for subprocesses."""
        path = f"{PROJECT_ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
        return {**os.environ, **self.env_vars, "PATH": path}

    @property
    def api_url(self) -> str:
        return self.env_vars["PREFECT_API_URL"]

    @property
    def prefect_home(self) -> Path:
        return Path(self.env_vars["PREFECT_HOME"])

    @property
    def s3_endpoint_url(self) -> str:
        return self.env_vars["NEMO_RL_S3_ENDPOINT_URL"]

    @property
    def bucket(self) -> str:
        return self.env_vars["NEMO_RL_S3_BUCKET"]

    @property
    def storage_options(self) -> dict[str, Any]:
        """fsspec/s3fs options for ``s3://<bucket>/...`` on the stack's endpoint."""
        return {
            "key": self.env_vars["AWS_ACCESS_KEY_ID"],
            "secret": self.env_vars["AWS_SECRET_ACCESS_KEY"],
            "client_kwargs": {"endpoint_url": self.s3_endpoint_url},
        }

    def run(
        self,
        *args: str,
        cwd: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 300,
        check: bool = True,
    ) -> subprocess.CompletedProcess[str]:
        """Run a command with the stack's env (plus ``env``); on failure show its output."""
        proc = subprocess.run(
            args,
            cwd=cwd or PROJECT_ROOT,
            env={**self.env, **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {proc.returncode}\n"
                f"--- stdout (tail) ---\n{proc.stdout[-4000:]}\n--- stderr (tail) ---\n{proc.stderr[-4000:]}"
            )
        return proc

    def stack(
        self,
        *args: str,
        timeout: float = 600,
        check: bool = True,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """``infra/stack.sh ARGS`` on this stack's state dir (e.g. ``"start", "worker"``);
        ``env`` goes into the environment of the services it starts."""
        return self.run(str(STACK_SH), *args, timeout=timeout, check=check, env=env)

    def api(self, method: str, path: str, body: Any = None) -> Any:
        """Call the Prefect REST API (``path`` after ``/api``) and decode its JSON answer."""
        request = urllib.request.Request(
            f"{self.api_url}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def deploy_all(self) -> dict[str, str]:
        """``prefect deploy --all`` (prefect.yaml); returns each deployment's id by name."""
        self.run("prefect", "deploy", "--all", timeout=600)
        deployments = self.api("POST", "/deployments/filter", {})
        flows = {f["id"]: f["name"] for f in self.api("POST", "/flows/filter", {})}
        return {f"{flows[d['flow_id']]}/{d['name']}": d["id"] for d in deployments}

    def start_flow_run(
        self, deployment_id: str, parameters: dict[str, Any], env: dict[str, str] | None = None
    ) -> str:
        """A flow run of a deployment for the worker to pick up; ``env`` goes into the
        flow-run process's environment (the process work pool's ``env`` job variable)."""
        body: dict[str, Any] = {"parameters": parameters}
        if env:
            body["job_variables"] = {"env": env}
        return self.api("POST", f"/deployments/{deployment_id}/create_flow_run", body)["id"]

    def wait_for_flow_run(self, flow_run_id: str, timeout: float = 300) -> dict[str, Any]:
        """Poll a flow run until it reaches a final state; fail with the worker log tail."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            flow_run = self.api("GET", f"/flow_runs/{flow_run_id}")
            if flow_run["state_type"] in FINAL_STATES:
                return flow_run
            time.sleep(0.5)
        raise AssertionError(
            f"flow run {flow_run_id} not finished after {timeout:.0f} s "
            f"(state {flow_run['state_name']}); worker log tail:\n{self.log_tail('worker')}"
        )

    def flow_run_logs(self, flow_run_id: str) -> list[str]:
        """All log messages of a flow run (and its task runs), oldest first."""
        entries = every_entry(
            lambda offset: self.api(
                "POST",
                "/logs/filter",
                {
                    "logs": {"flow_run_id": {"any_": [flow_run_id]}},
                    "sort": "TIMESTAMP_ASC",
                    "limit": PAGE,
                    "offset": offset,
                },
            )
        )
        return [entry["message"] for entry in entries]

    def wait_for_log(self, flow_run_id: str, text: str, timeout: float = 60) -> list[str]:
        """A flow run's log messages once one contains ``text``."""
        return wait_for_text(lambda: self.flow_run_logs(flow_run_id), text, timeout)

    def log_tail(self, service: str, lines: int = 40) -> str:
        """The last lines of a service's log (postgres, s3, server, worker, register)."""
        path = self.state_dir / "logs" / f"{service}.log"
        return (
            "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
            if path.exists()
            else ""
        )

    def worker_pid(self, pool: str | None = None) -> int:
        """The stack's worker, or (with ``pool``: ``rollout-pool``, or ``rollout-pool#2`` for
        its second) a stage worker of that pool."""
        return int((self.state_dir / "run" / f"{_worker(pool)}.pid").read_text())

    def flow_run_pids(self, flow_run_id: str | None = None) -> list[int]:
        """The processes executing flow runs (of ``flow_run_id`` only, if given): each the
        top ``prefect.engine`` process whose environment names its flow run, wherever it
        sits in the worker's process tree (its forked reward workers are left out)."""
        engines = {
            pid: ppid
            for pid, ppid, args in _process_table()
            if "prefect.engine" in args and _flow_run_of(pid) is not None
        }
        return [
            pid
            for pid, ppid in engines.items()
            if ppid not in engines and flow_run_id in (None, _flow_run_of(pid))
        ]

    def restart_worker(self, pool: str | None = None, env: dict[str, str] | None = None) -> None:
        """Start the worker (a stage worker of ``pool``) again after it was lost, or for the
        first time (``infra/stack.sh start worker@POOL``), with ``env`` in its environment."""
        self.stack("start", _worker(pool), env=env)

    def stop_workers(self, *pools: str) -> None:
        """Stop a stage worker of each of ``pools``, side by side (``infra/stack.sh stop
        worker@POOL ...``)."""
        self.stack("stop", *map(_worker, pools))

    def live_stage_workers(self, pool: str) -> list[str]:
        """The stage workers the server holds connected for ``pool`` (host-pid each)."""
        body = {"task_worker_filter": {"task_keys": [f"stage@{pool}"]}}
        return sorted(
            worker["identifier"] for worker in self.api("POST", "/task_workers/filter", body)
        )


def _worker(pool: str | None) -> str:
    """stack.sh's name of the stack's worker, or of a stage worker of a pool."""
    return "worker" if pool is None else f"worker@{pool}"


def _process_table() -> list[tuple[int, int, str]]:
    """(pid, parent pid, command line) of every process."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True
    ).stdout
    rows = [line.split(None, 2) for line in out.splitlines()]
    return [(int(row[0]), int(row[1]), row[2] if len(row) > 2 else "") for row in rows]


def _flow_run_of(pid: int) -> str | None:
    """The flow run id a Prefect worker put into a process's environment, if readable."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:  # gone meanwhile, or another user's
        return None
    for entry in environ:
        if entry.startswith(b"PREFECT__FLOW_RUN_ID="):
            return entry.split(b"=", 1)[1].decode()
    return None


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant of it, parents first."""
    table = _process_table()
    tree = [pid]
    for parent in tree:
        tree += [child for child, ppid, _ in table if ppid == parent]
    return tree


def kill_tree(pid: int) -> list[int]:
    """SIGKILL ``pid`` and its descendants (its forked reward workers must not outlive it,
    as they would not outlive a lost machine); returns the pids signalled."""
    pids = process_tree(pid)
    for each in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)
    return pids


def start_stack(
    state_dir: Path,
    components: Sequence[str] = (),
    cpus: str | None = None,
    settings: dict[str, str] | None = None,
) -> tuple[LocalStack, str]:
    """``infra/stack.sh start [COMPONENTS]`` into ``state_dir`` on free ports (every
    component when none is named); with ``cpus`` (``taskset -c`` syntax) every process of
    the stack runs on those cores only; ``settings`` (e.g. Prefect server settings) go into
    the environment of every service it starts, then and on any later start through the
    returned stack. Returns the stack and the script's output (per-service start times)."""
    ports = {"pg": free_port(), "api": free_port(), "s3": free_port()}
    env = {
        **os.environ,
        "INFRA_STATE_DIR": str(state_dir),
        "INFRA_PG_PORT": str(ports["pg"]),
        "INFRA_API_PORT": str(ports["api"]),
        "INFRA_S3_PORT": str(ports["s3"]),
        **(settings or {}),
    }
    pinned = [] if cpus is None else ["taskset", "-c", cpus]
    proc = subprocess.run(
        [*pinned, str(STACK_SH), "start", *components],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"infra/stack.sh start failed:\n{proc.stdout}\n{proc.stderr}")
    env_vars = {**_read_env_file(state_dir / "env.sh"), **(settings or {})}
    return LocalStack(state_dir, ports, env_vars), proc.stdout


def attach_stack(state_dir: Path) -> LocalStack:
    """A stack that ``infra/stack.sh start`` already runs in ``state_dir``."""
    return LocalStack(state_dir, {}, _read_env_file(state_dir / "env.sh"))


def stop_stack(state_dir: Path) -> None:
    """``infra/stack.sh stop`` for ``state_dir``: ends every process the stack started."""
    env = {**os.environ, "INFRA_STATE_DIR": str(state_dir)}
    subprocess.run([str(STACK_SH), "stop"], env=env, timeout=300, check=False)


@contextmanager
def running_stack(
    components: Sequence[str] = (),
    cpus: str | None = None,
    settings: dict[str, str] | None = None,
) -> Iterator[LocalStack]:
    """A stack (``components`` of it, on ``cpus``, with ``settings``: see ``start_stack``)
    in a fresh state dir for the life of the block, stopped and removed after, even on
    failure."""
    # Not under pytest's tmp dir: that one is private to its owner, and PostgreSQL runs as
    # the `postgres` OS user when this runs as root.
    state_dir = Path(tempfile.mkdtemp(prefix="nemo-rl-stack-"))
    state_dir.chmod(0o755)
    try:
        started = time.monotonic()
        stack, output = start_stack(state_dir, components, cpus, settings)
        print(f"\nlocal stack up in {time.monotonic() - started:.1f} s:\n{output}", flush=True)
        yield stack
    finally:
        stop_stack(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
