"""The local stack itself: healthy services, a deployed flow run by the worker, a cron
schedule on the server, S3 blocks whose secret stays out of logs, and a clean stop."""

import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import s3fs
import yaml
from local_stack import PROJECT_ROOT, LocalStack, attach_stack, free_port

pytestmark = pytest.mark.stack

PROBE_PROJECT_YAML = """\
name: stack-probe
prefect-version: 3.7.7
build: null
push: null
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{{ $PROBE_PROJECT_DIR }}"
definitions:
  parameters: &probe_parameters
    message: from-the-deployment
    key: probe/default.txt
    bucket_block: "{{ $NEMO_RL_S3_BUCKET_BLOCK }}"
    credentials_block: "{{ $NEMO_RL_S3_CREDENTIALS_BLOCK }}"
deployments:
  - name: manual
    entrypoint: probe_flow.py:stack_probe
    parameters: *probe_parameters
    work_pool: {name: "{{ $NEMO_RL_WORK_POOL }}"}
  - name: nightly
    entrypoint: probe_flow.py:stack_probe
    parameters: *probe_parameters
    schedules:
      - cron: "0 2 * * *"
        timezone: UTC
    work_pool: {name: "{{ $NEMO_RL_WORK_POOL }}"}
"""


def run_deployment(local_stack: LocalStack, name: str, *params: str) -> str:
    """``prefect deployment run NAME --param ...``; returns the new flow run's id."""
    args = [arg for param in params for arg in ("--param", param)]
    out = local_stack.run("prefect", "deployment", "run", name, *args).stdout
    match = re.search(r"UUID: ([0-9a-f-]{36})", out)
    assert match, f"no flow run id in the output of prefect deployment run:\n{out}"
    return match.group(1)


def service_pids(local_stack: LocalStack) -> dict[str, int]:
    """The process-group leaders stack.sh recorded, and the postmaster."""
    run_dir = local_stack.state_dir / "run"
    pids = {path.stem: int(path.read_text()) for path in run_dir.glob("*.pid")}
    pids["postgres"] = int(
        (local_stack.state_dir / "pgdata" / "postmaster.pid").read_text().split()[0]
    )
    return pids


def pause_all_schedules(local_stack: LocalStack) -> None:
    """Pause every schedule (the server then drops their runs), so no nightly starts in a test."""
    local_stack.run("prefect", "deployment", "schedule", "pause", "--all")
    scheduled = local_stack.api(
        "POST", "/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}}}
    )
    assert not [run for run in scheduled if run["auto_scheduled"]], scheduled


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (a worker's flow-run processes)."""
    children: dict[int, list[int]] = {}
    for line in subprocess.run(
        ["ps", "-eo", "pid=,ppid="], capture_output=True, text=True
    ).stdout.splitlines():
        child, parent = map(int, line.split())
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """Running, not merely an unreaped zombie (a container's init may not reap)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def deploy_probe_project(stack: LocalStack, project: Path) -> Path:
    """A throwaway project with the probe flow in ``project``, deployed on ``stack`` with
    ``prefect deploy --all``."""
    project.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(__file__).parent / "probe_flow.py", project / "probe_flow.py")
    (project / "prefect.yaml").write_text(PROBE_PROJECT_YAML)
    stack.run("prefect", "deploy", "--all", cwd=project, env={"PROBE_PROJECT_DIR": str(project)})
    return project


@pytest.fixture(scope="module")
def probe_project(local_stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The probe project deployed on the session's stack."""
    return deploy_probe_project(local_stack, tmp_path_factory.mktemp("probe-project"))


@pytest.fixture(scope="module")
def probe_run(local_stack: LocalStack, probe_project: Path) -> dict[str, Any]:
    """One finished run of ``stack-probe/manual`` started the way a user would."""
    key = f"probe/{uuid.uuid4().hex}.txt"
    flow_run_id = run_deployment(
        local_stack, "stack-probe/manual", "message=hello-s3", f"key={key}"
    )
    flow_run = local_stack.wait_for_flow_run(flow_run_id, timeout=300)
    logs = local_stack.wait_for_log(flow_run_id, "Finished in state")
    return {"flow_run": flow_run, "key": key, "logs": logs}


@pytest.fixture(scope="module")
def fresh_stack() -> Iterator[LocalStack]:
    """A stack of its own, on its own ports, started by ``infra/stack.sh start
    worker@fresh-pool`` on a state dir that runs nothing; stopped and removed after this
    module. Not the session's stack: the last test here stops it."""
    state_dir = Path(tempfile.mkdtemp(prefix="nemo-rl-fresh-"))
    state_dir.chmod(0o755)
    ports = {"pg": free_port(), "api": free_port(), "s3": free_port()}
    env = {
        **os.environ,
        "INFRA_STATE_DIR": str(state_dir),
        **{f"INFRA_{name.upper()}_PORT": str(port) for name, port in ports.items()},
    }
    env.pop("NEMO_RL_INFRA_STATE_DIR", None)
    stack = [str(PROJECT_ROOT / "infra" / "stack.sh")]
    try:
        started = subprocess.run(
            [*stack, "start", "worker@fresh-pool"],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        yield LocalStack(state_dir, ports, attach_stack(state_dir).env_vars)
    finally:
        subprocess.run([*stack, "stop"], env=env, timeout=300, check=False)
        shutil.rmtree(state_dir, ignore_errors=True)


def test_a_stage_worker_on_a_fresh_stack_starts_what_it_needs(fresh_stack: LocalStack) -> None:
    """``infra/stack.sh start worker@POOL`` on a state dir that runs nothing starts
    PostgreSQL, S3 and the server first; then the server lists the stage worker, and a shell
    that sourced ``env.sh`` finds the venv's ``prefect`` first on its PATH."""
    fresh = fresh_stack
    status = fresh.stack("status", check=False).stdout  # exits 1: no process worker here
    for service in ("postgres", "s3", "server", "worker@fresh-pool"):
        assert f"{service}: up" in status, status
    assert fresh.live_stage_workers("fresh-pool") == [
        f"{socket.gethostname()}-{fresh.worker_pid('fresh-pool')}"
    ]
    found = subprocess.run(
        ["bash", "-c", f"source {fresh.state_dir}/env.sh && command -v prefect"],
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert found == str(PROJECT_ROOT / ".venv" / "bin" / "prefect"), found


def test_stop_leaves_nothing_running(fresh_stack: LocalStack, tmp_path: Path) -> None:
    """On the fresh stack (its stage worker still up), after its process worker runs a
    deployed flow run and is killed mid-run and restarted: the stack stops with the orphaned
    run still going, and must end it too; then it starts again on the same state."""
    fresh = fresh_stack
    fresh.stack("start", "worker")
    deploy_probe_project(fresh, tmp_path / "probe-project")
    flow_run_id = run_deployment(
        fresh, "stack-probe/manual", "key=probe/held.txt", "hold_seconds=600"
    )
    deadline = time.monotonic() + 120
    while fresh.api("GET", f"/flow_runs/{flow_run_id}")["state_type"] != "RUNNING":
        assert time.monotonic() < deadline, f"held run not RUNNING:\n{fresh.log_tail('worker')}"
        time.sleep(0.5)
    killed_worker = service_pids(fresh)["worker"]
    orphaned_run = descendants(killed_worker)
    assert orphaned_run, "the held flow run has no process under the worker"
    os.kill(killed_worker, signal.SIGKILL)
    while alive(killed_worker):  # the kill lands when the process is next scheduled
        time.sleep(0.1)
    assert "worker: down" in fresh.stack("status", check=False).stdout
    fresh.stack("start", "worker")
    pids = service_pids(fresh)
    assert pids["worker"] != killed_worker
    assert "worker@fresh-pool" in pids, pids
    everything = (
        set(pids.values())
        | orphaned_run
        | descendants(pids["worker"])
        | descendants(pids["postgres"])
    )
    fresh.stack("stop")
    # A SIGKILLed process ends when next scheduled: on a loaded machine, seconds later.
    deadline = time.monotonic() + 30
    while (left := sorted(pid for pid in everything if alive(pid))) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.5)
    assert not left, f"still running 30 s after stop: {left}"
    open_ports = {name: port for name, port in fresh.ports.items() if port_open(port)}
    assert not open_ports, f"still listening after stop: {open_ports}"
    # The database persists: the same state dir starts again.
    fresh.stack("start")
    assert fresh.stack("status").stdout.count(": up") == 4
    fresh.stack("stop")  # not left idling beside the session's stack for the module's rest


def test_stack_is_healthy(local_stack: LocalStack) -> None:
    status = local_stack.stack("status").stdout
    assert status.count(": up") == 4, status
    assert local_stack.api("GET", "/health") is True
    pool = local_stack.api("GET", f"/work_pools/{local_stack.env_vars['NEMO_RL_WORK_POOL']}")
    assert pool["type"] == "process"
    workers = local_stack.api("POST", f"/work_pools/{pool['name']}/workers/filter", {})
    assert [w["status"] for w in workers] == ["ONLINE"], workers
    fs = s3fs.S3FileSystem(**local_stack.storage_options)
    assert fs.exists(local_stack.bucket)
    credentials = local_stack.api(
        "GET", "/block_types/slug/aws-credentials/block_documents/name/nemo-rl-s3-credentials"
    )
    assert (
        credentials["data"]["aws_client_parameters"]["endpoint_url"] == local_stack.s3_endpoint_url
    )
    bucket_block = local_stack.api(
        "GET", "/block_types/slug/s3-bucket/block_documents/name/nemo-rl-s3"
    )
    assert bucket_block["data"]["bucket_name"] == local_stack.bucket
    # Where background task runs (placed stages) keep their parameters: every machine's
    # stage workers read them there.
    scheduling = local_stack.env_vars["PREFECT_TASKS_SCHEDULING_DEFAULT_STORAGE_BLOCK"]
    assert scheduling == "s3-bucket/nemo-rl-task-scheduling"
    scheduling_block = local_stack.api(
        "GET", "/block_types/slug/s3-bucket/block_documents/name/nemo-rl-task-scheduling"
    )
    assert scheduling_block["data"]["bucket_name"] == local_stack.bucket


def test_start_again_keeps_the_running_services(local_stack: LocalStack) -> None:
    before = service_pids(local_stack)
    local_stack.stack("start")
    assert service_pids(local_stack) == before


def test_deployed_flow_is_run_by_the_worker(local_stack: LocalStack, probe_run: dict) -> None:
    flow_run = probe_run["flow_run"]
    assert flow_run["state_type"] == "COMPLETED", (
        f"{flow_run['state_name']}: {probe_run['logs'][-10:]}\n{local_stack.log_tail('worker')}"
    )
    fs = s3fs.S3FileSystem(**local_stack.storage_options)
    assert fs.cat_file(f"{local_stack.bucket}/{probe_run['key']}") == b"hello-s3"
    assert any("wrote and read back" in message for message in probe_run["logs"])


def test_cron_deployment_lists_its_next_runs(local_stack: LocalStack, probe_project: Path) -> None:
    deployment = local_stack.api("GET", "/deployments/name/stack-probe/nightly")
    assert [s["schedule"]["cron"] for s in deployment["schedules"]] == ["0 2 * * *"]
    query = {
        "deployments": {"id": {"any_": [deployment["id"]]}},
        "flow_runs": {"state": {"type": {"any_": ["SCHEDULED"]}}},
        "sort": "EXPECTED_START_TIME_ASC",
    }
    # The server's scheduler picks up a new deployment within seconds.
    deadline = time.monotonic() + 60
    while not (scheduled := local_stack.api("POST", "/flow_runs/filter", query)):
        assert time.monotonic() < deadline, (
            f"no scheduled runs 60 s after deploying a cron schedule; server log:\n"
            f"{local_stack.log_tail('server')}"
        )
        time.sleep(1)
    starts = [datetime.fromisoformat(run["expected_start_time"]) for run in scheduled]
    assert all(start > datetime.now(UTC) for start in starts)
    assert all((start.hour, start.minute) == (2, 0) for start in starts), starts
    pause_all_schedules(local_stack)


def test_s3_secret_never_appears_in_logs(local_stack: LocalStack, probe_run: dict) -> None:
    secret = local_stack.env_vars["AWS_SECRET_ACCESS_KEY"]
    logs = probe_run["logs"]
    assert any("credentials block" in message for message in logs), logs
    assert all(secret not in message for message in logs)
    for service in ("worker", "server", "register"):
        assert secret not in (local_stack.state_dir / "logs" / f"{service}.log").read_text()


def test_project_prefect_yaml_declares_the_deployments() -> None:
    spec = yaml.safe_load((PROJECT_ROOT / "prefect.yaml").read_text())
    deployments = {(d["entrypoint"], d["name"]): d for d in spec["deployments"]}
    assert set(deployments) == {
        ("flows/grpo.py:grpo", "manual"),
        ("flows/grpo.py:grpo", "nightly"),
        ("flows/ppo.py:ppo", "manual"),
        ("flows/sft.py:sft", "manual"),
        ("flows/chain.py:sft_grpo_eval", "sft-grpo-eval"),
        ("flows/distillation.py:distillation", "manual"),
        ("flows/dpo.py:dpo", "manual"),
        ("flows/rm.py:rm", "manual"),
        ("flows/eval.py:evaluate", "manual"),
        ("flows/rerun_stage.py:rerun_stage", "default"),
        ("flows/verify.py:verify_run", "default"),
    }
    # Placed stages are task runs of stage workers, not deployments of their own.
    assert {d["work_pool"]["name"] for d in spec["deployments"]} == {"local-process"}
    nightly = deployments[("flows/grpo.py:grpo", "nightly")]
    assert nightly["schedules"][0]["cron"] == "0 2 * * *"
    assert {"run_id", "steps_per_run"} <= set(nightly["parameters"])
    [pull_step] = spec["pull"]
    assert "prefect.deployments.steps.set_working_directory" in pull_step


def code_version() -> str:
    return subprocess.run(
        ["git", "describe", "--always", "--dirty", "--tags"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_prefect_loads_versions_and_concurrency_limits() -> None:
    """Prefect's own loader and build steps: every deployment is versioned by the code it
    runs, and each training deployment runs one flow run at a time."""
    import asyncio

    from prefect.cli.deploy._config import _load_deploy_configs_and_actions
    from prefect.deployments.steps.utility import run_shell_script
    from prefect.utilities.templating import apply_values
    from rich.console import Console

    configs, actions = _load_deploy_configs_and_actions(
        PROJECT_ROOT / "prefect.yaml", console=Console(stderr=True)
    )
    assert len(configs) == 11, "prefect.yaml did not validate as Prefect reads it"
    [step] = actions["build"]  # the version step, run as `prefect deploy` runs it
    settings = dict(step["prefect.deployments.steps.run_shell_script"])
    step_id = settings.pop("id")
    output = asyncio.run(run_shell_script(**settings, directory=str(PROJECT_ROOT)))
    outputs = {step_id: output}
    resolved = {(c["entrypoint"], c["name"]): apply_values(c, outputs) for c in configs}
    assert {c["version"].strip() for c in resolved.values()} == {code_version()}
    limits = {key: c.get("concurrency_limit") for key, c in resolved.items()}
    assert limits == {
        ("flows/grpo.py:grpo", "manual"): 1,
        ("flows/grpo.py:grpo", "nightly"): 1,
        ("flows/ppo.py:ppo", "manual"): 1,
        ("flows/sft.py:sft", "manual"): 1,
        ("flows/chain.py:sft_grpo_eval", "sft-grpo-eval"): 1,
        ("flows/distillation.py:distillation", "manual"): 1,
        ("flows/dpo.py:dpo", "manual"): 1,
        ("flows/rm.py:rm", "manual"): 1,
        ("flows/eval.py:evaluate", "manual"): None,
        ("flows/rerun_stage.py:rerun_stage", "default"): None,
        ("flows/verify.py:verify_run", "default"): None,
    }


PROJECT_DEPLOYMENTS = (
    "grpo/manual",
    "grpo/nightly",
    "ppo/manual",
    "sft/manual",
    "chain/sft-grpo-eval",
    "distillation/manual",
    "dpo/manual",
    "rm/manual",
    "eval/manual",
    "rerun-stage/default",
    "verify-run/default",
)


def test_project_deployments_register(
    local_stack: LocalStack, stack_deployments: dict[str, str]
) -> None:
    """``prefect deploy --all`` of the project's prefect.yaml (the session's deployments,
    ``LocalStack.deploy_all``) registers every deployment under its flow's name
    (``eval/manual``: Prefect's ``--name`` would match the function, ``evaluate``, not the
    flow)."""
    registered = stack_deployments
    assert set(PROJECT_DEPLOYMENTS) <= set(registered), sorted(registered)
    for name in PROJECT_DEPLOYMENTS:
        deployment = local_stack.api("GET", f"/deployments/name/{name}")
        assert deployment["work_pool_name"] == "local-process"
        assert deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"] == {
            "directory": str(PROJECT_ROOT)
        }
        assert deployment["parameters"]["storage_root"] == f"s3://{local_stack.bucket}"
        assert deployment["version"].strip() == code_version(), name
        training = not name.startswith(("rerun-stage/", "verify-run/", "eval/"))
        limit = (deployment["global_concurrency_limit"] or {}).get("limit")
        assert limit == (1 if training else None), name
    pause_all_schedules(local_stack)
