"""A damaged stage output (same size, other bytes: the manifest's sha256 no longer matches)
is not trusted: found by the next stage within the running flow, or by a continued run, its
producer is run again from its stored inputs, bit-identically, and the run ends with the
uninterrupted run's weights."""

import json

import pytest
from toy_runs import ToyRuns

from tasks.faults import FAULT_ENV

STEPS = 3


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory, toy_model) -> ToyRuns:
    runs = ToyRuns(tmp_path_factory.mktemp("clean"), toy_model)
    runs.run("clean")
    return runs


def test_damage_found_mid_run_re_makes_the_input(
    clean: ToyRuns, toy: ToyRuns, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # answer@1 commits, then one byte of its output flips; score reads it next.
    monkeypatch.setenv(FAULT_ENV, "answer@1:damage")
    state = toy.run("damaged", return_state=True)
    assert state.is_completed(), state.message
    key = "iter_000001/answer/batch.arrow"
    assert state.result()["remade"] == [key]
    assert f"{key} (output of stage 'answer' of iteration 1) is damaged" in caplog.text
    damaged, uninterrupted = toy.stages("damaged", 1), clean.stages("clean", 1)
    assert damaged["answer"]["outputs"] == uninterrupted["answer"]["outputs"]
    manifest = toy.run_dir("damaged") / "iter_000001" / "MANIFEST.json"
    [repair] = json.loads(manifest.read_text())["repairs"]  # on record, with both digests
    assert repair["key"] == key and "has sha256" in repair["damage"]
    assert toy.weights("damaged", STEPS) == clean.weights("clean", STEPS)


def test_damage_found_on_continue_re_makes_the_input(
    clean: ToyRuns, toy: ToyRuns, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAULT_ENV, "update@1")
    with pytest.raises(Exception, match="fault injected into stage 'update' of iteration 1"):
        toy.run("damaged")
    monkeypatch.delenv(FAULT_ENV)
    before = toy.stages("damaged", 1)
    damaged = toy.run_dir("damaged") / before["score"]["outputs"]["batch"]["key"]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, size unchanged
    damaged.write_bytes(bytes(data))

    toy.run("damaged")

    after = toy.stages("damaged", 1)
    assert after["score"]["finished_at"] != before["score"]["finished_at"], "damage trusted"
    assert after["score"]["outputs"] == before["score"]["outputs"], "not bit-identical"
    for stage in ("prompts", "answer"):
        assert after[stage]["finished_at"] == before[stage]["finished_at"], f"{stage} redone"
    assert toy.weights("damaged", STEPS) == clean.weights("clean", STEPS)
