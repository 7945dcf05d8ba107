"""``bench/vs_trl.py``'s summary over seeds on hand figures: each side's reward rise with
its standard error, each seed's rise and their mean over seeds, the per-step table and the
plot. The smoke run (test_smoke.py) runs one seed, so these are checked here."""

from pathlib import Path

import vs_trl  # tests/bench/conftest.py puts bench/ on the path

CURVES = {
    "seeds": [1, 2],
    "rewards": {
        "tiny-llama": {
            "ours (Prefect flow)": [[0.0, 0.5], [0.25, 0.75]],
            "TRL GRPOTrainer": [[0.5, 0.25], [0.5, 0.75]],
        }
    },
    "response_tokens": {"tiny-llama": {"ours (Prefect flow)": [[4.0, 6.0], [5.0, 5.0]]}},
}


def test_summary_over_two_seeds(tmp_path: Path) -> None:
    png = tmp_path / "rewards.png"
    lines = vs_trl.summarize(CURVES, None, png).splitlines()
    # first [0, .25] -> last [.5, .75]: +0.5, se sqrt(.03125/2 * 2); each seed rose 0.5
    ours = f"{'tiny-llama':<24}{'ours (Prefect flow)':<20}"
    assert (
        f"{ours} 0.125 -> 0.625: +0.500 +- 0.177; per seed [+0.500, +0.500] +0.500 +- 0.000"
        in lines
    )
    # first [.5, .5] -> last [.25, .75]: +0, se .25; the seeds fell and rose by .25
    trl = f"{'tiny-llama':<24}{'TRL GRPOTrainer':<20}"
    assert (
        f"{trl} 0.500 -> 0.500: +0.000 +- 0.250; per seed [-0.250, +0.250] +0.000 +- 0.250" in lines
    )
    table = lines.index("tiny-llama: mean reward per step +- std over seeds")
    assert lines[table + 1 : table + 5] == [
        "| step | ours (Prefect flow) | TRL GRPOTrainer |",
        "|---|---|---|",
        "| 1 | 0.125 +- 0.177 | 0.500 +- 0.000 |",
        "| 2 | 0.625 +- 0.177 | 0.500 +- 0.354 |",
    ]
    assert "reward per step (per seed [1, 2]): " in lines[-2]
    assert lines[-1].startswith("mean response tokens per step: ")
    assert png.stat().st_size > 0
