"""prefect.yaml against the declarations: every declared algorithm is deployed, no
deployment runs a flow that no declaration knows, every entrypoint loads as Prefect loads it,
and each deployment's example config validates as its algorithm's config."""

import json
import subprocess
import sys
from pathlib import Path

import yaml

from nemo_rl_core.pipeline.algorithm_configs import ALGORITHM_CONFIGS
from nemo_rl_core.utils.config import load_config_file

REPO = Path(__file__).resolve().parents[2]
# The project's flows that are not an algorithm's: they act on the runs of any.
OTHER_FLOWS = {"chain", "rerun-stage", "verify-run", "stage"}
LOAD_FLOWS = (
    "import json, yaml\n"
    "from prefect.flows import load_flow_from_entrypoint\n"
    "spec = yaml.safe_load(open('prefect.yaml'))\n"
    "print(json.dumps([\n"
    "    load_flow_from_entrypoint(d['entrypoint'], use_placeholder_flow=False).name\n"
    "    for d in spec['deployments']]))\n"
)


def test_prefect_yaml_deploys_every_declared_algorithm_and_no_unknown_one() -> None:
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    done = subprocess.run(
        [sys.executable, "-c", LOAD_FLOWS], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    flows = json.loads(done.stdout.splitlines()[-1])
    algorithms = set(ALGORITHM_CONFIGS)
    missing = algorithms - set(flows)
    assert not missing, f"declared algorithms without a deployment: {sorted(missing)}"
    unknown = [
        (d["entrypoint"], d["name"], flow)
        for d, flow in zip(deployments, flows, strict=True)
        if flow not in algorithms | OTHER_FLOWS
    ]
    assert unknown == [], f"deployments of flows no declaration knows: {unknown}"
    for deployment, flow in zip(deployments, flows, strict=True):
        config = (deployment.get("parameters") or {}).get("config_path")
        if flow in algorithms and config is not None:
            load_config_file(str(REPO / config), [], ALGORITHM_CONFIGS[flow].config_class)
