"""What the flows derive from a declaration: stale sets, reports, the stored run's algorithm,
and refusal of a declaration that could not run."""

import pytest

from nemo_rl_core.pipeline.algorithms import GRPO, PPO
from nemo_rl_core.pipeline.context import StageResult
from nemo_rl_core.pipeline.registry import pipeline_for_config, pipeline_named
from nemo_rl_core.pipeline.spec import Pipeline, RunAhead, Stage


def _noop(ctx):
    return StageResult({})


def test_rerun_marks_the_stage_and_its_transitive_readers_stale():
    assert GRPO.downstream_of("reward") == ["reward", "logprob", "advantage", "train", "checkpoint"]
    # train reads prompts directly: a rerun of prompts invalidates everything after it,
    # but not the validation of the weights the iteration started from
    assert GRPO.downstream_of("prompts") == list(GRPO.stage_names[1:])
    assert GRPO.downstream_of("validate") == ["validate", "checkpoint"]
    assert PPO.downstream_of("value") == ["value", "advantage", "train", "checkpoint"]
    assert GRPO.downstream_of("checkpoint") == ["checkpoint"]


def test_each_algorithm_declares_its_own_advantage_and_update():
    assert GRPO.stage("advantage").compute is not PPO.stage("advantage").compute
    assert PPO.stage("train").versions == ("policy", "value")
    assert GRPO.committing_stage.name == PPO.committing_stage.name == "train"


def test_reported_rows_come_from_the_stages():
    rows = list(PPO.reported_metrics())
    assert ("reward", "mean_reward") in rows and ("train", "value_loss") in rows
    assert ("train", "value_loss") not in list(GRPO.reported_metrics())


def test_stored_config_finds_its_algorithm_by_section():
    assert pipeline_for_config({"grpo": {}, "policy": {}}) is GRPO
    assert pipeline_for_config({"ppo": {}, "value": {}}) is PPO
    assert pipeline_named("ppo") is PPO
    with pytest.raises(ValueError, match="exactly one algorithm section"):
        pipeline_for_config({"policy": {}})


def test_a_stage_cannot_read_one_declared_after_it():
    with pytest.raises(ValueError, match=r"'a' reads \['b'\]"):
        Pipeline(
            "x", object, (Stage("a", _noop, reads=("b",)), Stage("b", _noop, commits=True)), "c"
        )


def test_a_pipeline_commits_at_most_once():
    assert Pipeline("x", object, (Stage("a", _noop),), "c").committing_stage is None
    with pytest.raises(ValueError, match="more than one committing stage"):
        Pipeline(
            "x", object, (Stage("a", _noop, commits=True), Stage("b", _noop, commits=True)), "c"
        )
    with pytest.raises(ValueError, match="declares stage 'a' twice"):
        Pipeline("x", object, (Stage("a", _noop), Stage("a", _noop, commits=True)), "c")


def test_unknown_stage_names_the_known_ones():
    with pytest.raises(KeyError, match="its stages are"):
        GRPO.stage("rewards")


def test_async_generate_reads_the_weights_the_age_bound_allows():
    """Iteration i generates from step i - max_trajectory_age_steps (not before step 0); the
    other stages read their own iteration's weights; synchronous runs lag nothing."""

    class Loop:
        def __init__(self, enabled: bool, age: int) -> None:
            self.async_grpo = type("A", (), {"enabled": enabled, "max_trajectory_age_steps": age})

    def config(enabled: bool, age: int = 2):
        return type("C", (), {"algorithm": Loop(enabled, age)})()

    overlapping = config(True)
    assert GRPO.ahead_depth(overlapping) == 2
    assert [GRPO.weights_step(overlapping, "generate", i) for i in range(5)] == [0, 0, 0, 1, 2]
    assert GRPO.weights_step(overlapping, "logprob", 4) == 4
    assert GRPO.lags(overlapping, "generate") and not GRPO.lags(overlapping, "train")
    assert GRPO.weights_step(config(False), "generate", 4) == 4
    assert not GRPO.lags(config(False), "generate")
    assert PPO.ahead_depth(config(True)) == 0


def test_run_ahead_stages_must_be_consecutive():
    stages = (Stage("a", _noop), Stage("b", _noop, reads=("a",)), Stage("c", _noop))
    with pytest.raises(ValueError, match="run-ahead stages"):
        Pipeline("x", object, stages, "c", run_ahead=RunAhead(("a", "c"), ("a",), lambda c: 1))
