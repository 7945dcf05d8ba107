"""``bench/scale_model.py``'s fit and prediction on hand figures (its smoke run is in
test_smoke.py with the other benchmarks')."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from scale_model import (  # noqa: E402
    CalibrationRun,
    SpreadCosts,
    StageFit,
    break_even,
    fit_line,
    predict,
    rank_group_costs,
)

FITS = {
    "generate": StageFit(fixed_s=1.0, per_sequence_s=0.01, bytes_per_sequence=0),
    "reward": StageFit(fixed_s=0.5, per_sequence_s=0.001, bytes_per_sequence=0),
    "train": StageFit(fixed_s=1.0, per_sequence_s=0.02, bytes_per_sequence=1e6),
}
COSTS = SpreadCosts(placed_s=0.4, spmd_step_s=0.3, spmd_launch_s=5.0, efficiency=1.0, iterations=50)


def test_a_line_through_two_sizes() -> None:
    assert fit_line((32, 128), (1.0, 4.0)) == pytest.approx((0.0, 1 / 32))
    assert fit_line((32, 128), (2.0, 2.0)) == (2.0, 0.0)


def test_unspread_stages_pay_no_spreading_cost() -> None:
    one = predict(FITS, 100, workers=1, ranks=1, bandwidth_mb_s=100, costs=COSTS)
    assert one == pytest.approx(1.0 + 1.0 + 0.5 + 0.1 + 1.0 + 2.0 + 1.0)


def test_fan_out_pays_a_placed_shard_and_a_merge_and_ranks_pay_their_group() -> None:
    many = predict(FITS, 100, workers=4, ranks=2, bandwidth_mb_s=100, costs=COSTS)
    generate = 1.0 + 0.4 + 1.0 + 0.25  # own fixed cost, placed shards, merge, a quarter
    # own fixed cost, the group's step, its launch over the 50 iterations, half, handoff
    train = 1.0 + 0.3 + 5.0 / 50 + 1.0 + 1.0
    assert many == pytest.approx(generate + 0.5 + 0.1 + train)


def test_colocated_ranks_pay_a_launch_every_iteration() -> None:
    dedicated = predict(FITS, 100, workers=1, ranks=2, bandwidth_mb_s=100, costs=COSTS)
    colocated = predict(FITS, 100, 1, 2, 100, COSTS, colocated=True)
    assert colocated - dedicated == pytest.approx(5.0 - 5.0 / 50)
    assert COSTS.train_ranks_s(colocated=True) == pytest.approx(5.3)
    # one process pays neither
    assert predict(FITS, 100, 1, 1, 100, COSTS, colocated=True) == predict(
        FITS, 100, 1, 1, 100, COSTS
    )


def test_break_even_is_where_the_saving_covers_the_cost() -> None:
    fit = FITS["generate"]
    n = break_even(fit, 2, 1.4)
    assert n == pytest.approx(280)
    assert fit.per_sequence_s * n * (1 - 1 / 2) == pytest.approx(1.4)
    assert break_even(fit, 2, 1.4, efficiency=0.5) == float("inf")  # 2 ranks at half speed


def test_a_rank_group_costs_what_the_run_on_ranks_adds_to_one_process() -> None:
    one = CalibrationRun({"train": 1.0}, first_train_s=1.5, teardown_s=2.0)
    ranks = CalibrationRun({"train": 1.4}, first_train_s=12.0, teardown_s=5.0)
    group = rank_group_costs(one, ranks, 32)
    assert group.step_s == pytest.approx(0.4)  # a later iteration's order, reads and commit
    assert group.start_s == pytest.approx(12.0 - 1.5 - 0.4)  # the first iteration, less a step
    assert group.stop_s == pytest.approx(3.0)  # the flow's teardown
    backwards = rank_group_costs(ranks, one, 32)  # never negative
    assert (backwards.step_s, backwards.start_s, backwards.stop_s) == (0.0, 0.0, 0.0)
