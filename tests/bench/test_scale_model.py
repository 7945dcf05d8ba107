"""``bench/scale_model.py``'s fit and prediction on hand figures (its smoke run is in
test_smoke.py with the other benchmarks')."""

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from scale_model import StageFit, fit_line, predict  # noqa: E402


def test_a_line_through_two_sizes() -> None:
    assert fit_line((32, 128), (1.0, 4.0)) == pytest.approx((0.0, 1 / 32))
    assert fit_line((32, 128), (2.0, 2.0)) == (2.0, 0.0)


def test_generate_splits_over_workers_and_train_over_gpus() -> None:
    fits = {
        "generate": StageFit(fixed_s=1.0, per_sequence_s=0.01, bytes_per_sequence=0),
        "reward": StageFit(fixed_s=0.5, per_sequence_s=0.001, bytes_per_sequence=0),
        "train": StageFit(fixed_s=1.0, per_sequence_s=0.02, bytes_per_sequence=1e6),
    }
    one = predict(fits, 100, workers=1, gpus=1, bandwidth_mb_s=100, efficiency=1.0)
    assert one == pytest.approx(1.0 + 1.0 + 0.5 + 0.1 + 1.0 + 2.0 + 1.0)
    many = predict(fits, 100, workers=4, gpus=2, bandwidth_mb_s=100, efficiency=1.0)
    assert many == pytest.approx(1.0 + 0.25 + 0.5 + 0.1 + 1.0 + 1.0 + 1.0)
