"""Importing ``flows`` sets the OpenMP wait policy that keeps small ops fast on shared cores
(issue 8: 8-16x per iteration), and a value the user set wins."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRINT_POLICY = "import os, flows; print(os.environ['OMP_WAIT_POLICY'])"


@pytest.mark.parametrize(("given", "expected"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_flows_sets_omp_wait_policy(given: str | None, expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run(
        [sys.executable, "-c", PRINT_POLICY], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == expected
