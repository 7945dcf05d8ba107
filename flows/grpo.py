"""The GRPO flow: each iteration is the diagram of DESIGN.md, one Prefect task run per stage,
as ``nemo_rl_core.pipeline.algorithms.GRPO`` declares it.

    prompts -> generate -> reward -> logprob -> advantage -> train -> checkpoint

Run locally without a server:
    python -m flows grpo --config examples/configs/grpo_math_tiny.yaml grpo.max_num_steps=3
Stages whose manifest entry is complete for the same inputs are skipped, so running the
same run_id again continues where a failed run stopped.
"""

from flows.cli import flow_or_command

grpo = flow_or_command("grpo", __name__)
