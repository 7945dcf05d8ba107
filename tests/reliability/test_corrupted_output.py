"""A damaged stage output (same size, other bytes: the manifest's sha256 no longer
matches) is detected when the resumed run reads it, and its producing stage is
re-executed, not trusted; the run ends with the weights of an uninterrupted run."""

import json
from pathlib import Path

import pytest
from reliability_helpers import (
    CONFIG,
    FAST,
    assert_no_half_written_objects,
    assert_same_weights,
    final_weights,
    run_dir,
)

from flows.grpo import grpo
from tasks.stage import FAULT_ENV

pytestmark = pytest.mark.e2e


def _stages(root: Path) -> dict:
    return json.loads((run_dir(root, "damaged") / "iter_000001" / "MANIFEST.json").read_text())[
        "stages"
    ]


def test_damaged_parquet_is_recomputed_by_its_stage(
    clean_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "train@1")
    with pytest.raises(Exception, match="fault injected into stage 'train' of iteration 1"):
        grpo(config_path=str(CONFIG), overrides=FAST, run_id="damaged", storage_root=str(tmp_path))
    monkeypatch.delenv(FAULT_ENV)
    before = _stages(tmp_path)
    damaged = run_dir(tmp_path, "damaged") / before["reward"]["outputs"]["batch"]["key"]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, size unchanged
    damaged.write_bytes(bytes(data))

    grpo(config_path=str(CONFIG), overrides=FAST, run_id="damaged", storage_root=str(tmp_path))

    after = _stages(tmp_path)
    assert after["reward"]["finished_at"] != before["reward"]["finished_at"], "damage trusted"
    assert after["reward"]["outputs"] == before["reward"]["outputs"], "not bit-identical"
    for stage in ("prompts", "generate", "logprob", "advantage"):
        assert after[stage]["finished_at"] == before[stage]["finished_at"], f"{stage} redone"
    assert_same_weights(final_weights(clean_run, "clean"), final_weights(tmp_path, "damaged"))
    assert_no_half_written_objects(tmp_path, "damaged")
