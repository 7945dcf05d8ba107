"""The stack serves Prefect's web UI: a finished GRPO flow run of the ``grpo/manual``
deployment, looked at in headless Chromium as an operator would (its page, its Parameters
tab, its Artifacts tab, the artifacts it lists), shows what the run stored."""

import pytest
from headless_browser import Browser
from local_stack import LocalStack

from flows.progress import artifact_key
from flows.report import run_summaries, summary_row
from nemo_rl_core.storage.run_storage import RunStorage

pytestmark = [pytest.mark.stack, pytest.mark.e2e]
RUN_ID = "web-ui"
PARAMETERS = {
    "run_id": RUN_ID,
    "config_path": "examples/configs/grpo_math_tiny_fast.yaml",
    "overrides": ["grpo.max_num_steps=1"],
}


def test_finished_grpo_run_shows_its_metrics_in_the_web_ui(
    local_stack: LocalStack, stack_deployments: dict[str, str]
) -> None:
    flow_run_id = local_stack.start_flow_run(stack_deployments["grpo/manual"], PARAMETERS)
    final = local_stack.wait_for_flow_run(flow_run_id, timeout=900)
    assert final["state_type"] == "COMPLETED", "\n".join(
        local_stack.flow_run_logs(flow_run_id)[-30:]
    )
    storage = RunStorage(
        f"s3://{local_stack.bucket}", RUN_ID, storage_options=local_stack.storage_options
    )
    expected = [summary_row(summary) for summary in run_summaries(storage)]
    assert len(expected) == 1 and expected[0]["reward"] != "-", expected

    ui = local_stack.api_url.removesuffix("/api")
    with Browser() as browser:
        browser.open(f"{ui}/runs/flow-run/{flow_run_id}")
        browser.wait_for_text(f"grpo-{RUN_ID}", "algorithm:grpo", f"run:{RUN_ID}", "Completed")
        browser.click("#parameters")
        browser.wait_for_text(
            f'"run_id": "{RUN_ID}"', f'"storage_root": "s3://{local_stack.bucket}"'
        )

        browser.click("#artifacts")
        browser.wait_for_text("metrics per iteration", "metrics of iteration 0", "resolved config")
        browser.click("a", artifact_key(RUN_ID, "metrics"))
        browser.wait_for_text("metrics per iteration", "Show raw data")
        header, *rows = browser.table_rows()
        assert header == list(expected[0]), header
        assert len(rows) == len(expected), rows
        for row, want in zip(rows, expected, strict=True):
            shown = dict(zip(header, row, strict=True))
            # The UI leaves a cell empty where the iteration measured nothing ("-").
            assert {k: v for k, v in want.items() if v != "-"} == {
                k: shown[k] for k, v in want.items() if v != "-"
            }, (shown, want)

        browser.open(f"{ui}/runs/flow-run/{flow_run_id}")
        browser.wait_for_text("Artifacts", "Completed")
        browser.click("#artifacts")
        browser.wait_for_text("resolved config")
        browser.click("a", artifact_key(RUN_ID, "config"))
        browser.wait_for_text(
            "num_prompts_per_step: 2", "max_num_steps: 1", "stage_timeout_seconds"
        )
