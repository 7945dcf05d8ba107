"""prefect.yaml against the declarations: every declared algorithm is deployed, no
deployment runs a flow that no declaration knows, every entrypoint loads as Prefect loads it,
and each deployment's example config validates as its algorithm's config.

The entrypoints load in this process, as Prefect's loader runs them (each script executed as
a module of its own): the flows they import are this process's already. A cold process that
loads ``flows/grpo.py:grpo`` first is the stack's worker's (tests/stack, tests/reliability).
"""

import sys
from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint

from nemo_rl_core.pipeline.algorithm_configs import ALGORITHM_CONFIGS
from nemo_rl_core.utils.config import load_config_file

REPO = Path(__file__).resolve().parents[2]
# The project's flows that are not an algorithm's: they act on the runs of any.
OTHER_FLOWS = {"chain", "rerun-stage", "verify-run", "stage"}


def entrypoint_flows(entrypoints: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of the flow each entrypoint loads, loaded from the repository root as a
    deployment's working directory has it. Prefect's loader leaves each script's module in
    ``sys.modules`` and its folder first on ``sys.path``: both are undone after, so that the
    rest of this process imports as before (the modules the scripts imported stay)."""
    monkeypatch.chdir(REPO)
    path, modules = list(sys.path), set(sys.modules)
    scripts = {str(REPO / entrypoint.rsplit(":", 1)[0]) for entrypoint in entrypoints}
    try:
        return [
            load_flow_from_entrypoint(entrypoint, use_placeholder_flow=False).name
            for entrypoint in entrypoints
        ]
    finally:
        sys.path[:] = path
        for name in set(sys.modules) - modules:
            if getattr(sys.modules[name], "__file__", None) in scripts:
                del sys.modules[name]


def test_prefect_yaml_deploys_every_declared_algorithm_and_no_unknown_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    flows = entrypoint_flows([d["entrypoint"] for d in deployments], monkeypatch)
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
