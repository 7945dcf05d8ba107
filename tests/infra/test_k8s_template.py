"""The container image definition and the Kubernetes pool's base job template, checked the
way Prefect checks them when a pool is created and a deployment's job variables are set."""

import json
import re
from pathlib import Path

import pytest
import yaml
from prefect.server.schemas.actions import WorkPoolCreate
from prefect.utilities.schema_tools import ValidationError, validate
from prefect.utilities.templating import apply_values

from nemo_rl_core.pipeline.algorithms import GRPO, PPO

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = json.loads((REPO / "infra/k8s/base-job-template.json").read_text())
STAGE_VARIABLES = yaml.safe_load((REPO / "infra/k8s/stage-job-variables.yaml").read_text())
# What a worker fills in itself for every flow run.
WORKER_VALUES = {
    "name": "grpo-run",
    "command": "prefect flow-run execute",
    "env": {"PREFECT__FLOW_RUN_ID": "0"},
    "labels": {"prefect.io/flow-run-id": "0"},
}


def rendered(stage: str) -> dict:
    """The Job manifest a worker would submit for ``stage``'s pod."""
    defaults = {
        name: spec["default"]
        for name, spec in TEMPLATE["variables"]["properties"].items()
        if "default" in spec
    }
    values = {**defaults, **WORKER_VALUES, **STAGE_VARIABLES[stage]}
    return apply_values(TEMPLATE["job_configuration"], values)["job_manifest"]


def check_job_variables(variables: dict) -> None:
    """Prefect's check of a deployment's job variables against the pool's schema."""
    validate(
        variables, TEMPLATE["variables"], raise_on_error=True, preprocess=True, ignore_required=True
    )


def test_prefect_accepts_the_template_as_a_kubernetes_pool() -> None:
    pool = WorkPoolCreate(name="k8s-gpu", type="kubernetes", base_job_template=TEMPLATE)
    assert pool.base_job_template == TEMPLATE


def test_every_stage_has_job_variables_valid_for_the_pool() -> None:
    stages = {stage.name for pipeline in (GRPO, PPO) for stage in pipeline.stages}
    assert set(STAGE_VARIABLES) == stages
    for variables in STAGE_VARIABLES.values():
        check_job_variables(variables)


@pytest.mark.parametrize(
    "variables", [{"gpus": -1}, {"gpus": "eight"}, {"image_pull_policy": "Sometimes"}]
)
def test_prefect_refuses_bad_job_variables(variables: dict) -> None:
    with pytest.raises(ValidationError):
        check_job_variables(variables)


@pytest.mark.parametrize("stage,gpus", [("generate", 8), ("train", 8), ("reward", 0)])
def test_each_stage_pod_requests_its_gpus(stage: str, gpus: int) -> None:
    manifest = rendered(stage)
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert container["args"] == "prefect flow-run execute"
    assert manifest["metadata"]["namespace"] == "nemo-rl"
    if gpus:
        assert "nvidia.com/gpu.product" in manifest["spec"]["template"]["spec"]["nodeSelector"]


def test_the_image_copies_what_exists_and_points_prefect_at_it() -> None:
    containerfile = (REPO / "infra/Containerfile").read_text()
    copied = [
        source
        for line in containerfile.splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    ]
    assert copied and all((REPO / source).exists() for source in copied), copied
    # Each flavor's stage names its lock, and the image is built from one of the stages.
    flavors = dict(re.findall(r"AS base-(\w+)\n(?:.*\n)*?ENV LOCK=(\S+)", containerfile))
    assert flavors == {"cpu": "requirements/lock.txt", "cuda": "requirements/lock-cuda.txt"}
    assert all((REPO / lock).is_file() for lock in flavors.values())
    assert re.search(r"^ARG FLAVOR=cpu$", containerfile, re.MULTILINE)
    assert re.search(r"^FROM base-\$\{FLAVOR\}$", containerfile, re.MULTILINE)
    # prefect.yaml's pull step changes into $NEMO_RL_PROJECT_ROOT: the image must set it.
    assert "NEMO_RL_PROJECT_ROOT" in (REPO / "prefect.yaml").read_text()
    assert "NEMO_RL_PROJECT_ROOT=/srv/nemo-rl-core" in containerfile
    assert "WORKDIR /srv/nemo-rl-core" in containerfile
