"""The manifest as typed records: runs stored before the records existed read as they
were written, and what is written now is the same JSON, byte for byte."""

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nemo_rl_core.storage.manifest import (
    DamagedInput,
    Manifest,
    RanOn,
    Repair,
    StageEntry,
    StageRun,
)
from nemo_rl_core.storage.object_store import json_bytes
from nemo_rl_core.storage.run_storage import IntegrityError, ObjectRef, RunStorage

SHA = "ab" * 32
# iter_000000/MANIFEST.json as the storage wrote it before its records were typed (dicts
# put together by hand): a complete stage with where it ran and float metrics, a stale
# one without ``ran_on`` (stored before stages recorded it), a repair.
STORED_MANIFEST = b"""{
  "repairs": [
    {
      "at": "2025-01-02T03:04:06+00:00",
      "damage": "has sha256 ab, its reference says cd",
      "key": "iter_000000/generate/batch.arrow"
    }
  ],
  "stages": {
    "generate": {
      "finished_at": "2025-01-02T03:04:06+00:00",
      "inputs": {
        "config": "c",
        "p": "1"
      },
      "metrics": {
        "nan": NaN,
        "seconds": 0.30000000000000004,
        "tok": 3
      },
      "outputs": {
        "batch": {
          "key": "iter_000000/generate/batch.arrow",
          "sha256": "abababababababababababababababababababababababababababababababab",
          "size": 1018
        }
      },
      "ran_on": {
        "flow_run": "fr-1",
        "host": "host-1",
        "pool": "pool-a",
        "worker": null
      },
      "status": "complete"
    },
    "reward": {
      "finished_at": "2025-01-02T03:04:05.678901+00:00",
      "inputs": {
        "config": "c"
      },
      "metrics": {},
      "outputs": {
        "metrics": {
          "key": "iter_000000/reward/metrics.json",
          "sha256": "abababababababababababababababababababababababababababababababab",
          "size": 17
        }
      },
      "status": "stale"
    }
  }
}"""
# A part's entry is stored compact, in the order its fields were written.
STORED_PART = (
    b'{"status": "complete", "inputs": {"g": "x"}, "outputs": {"batch": {"key": '
    b'"iter_000000/reward/shard-0-of-2.batch.arrow", "size": 1018, "sha256": "'
    + SHA.encode()
    + b'"}}, "metrics": {"k": 1}, "finished_at": "2025-01-02T03:04:06+00:00", "ran_on": '
    b'{"pool": "pool-a", "worker": null, "host": "host-1", "flow_run": "fr-1"}}'
)


def _stored_run(tmp_path: Path) -> RunStorage:
    iteration = tmp_path / "runs" / "old" / "iter_000000"
    (iteration / "reward").mkdir(parents=True)
    (iteration / "MANIFEST.json").write_bytes(STORED_MANIFEST)
    (iteration / "reward" / "shard-0-of-2.entry.json").write_bytes(STORED_PART)
    return RunStorage(str(tmp_path), "old")


def test_a_stored_manifest_reads_as_typed_entries(tmp_path: Path) -> None:
    manifest = _stored_run(tmp_path).read_manifest(0)
    generate = manifest.stages["generate"]
    assert generate.complete and generate.inputs == {"config": "c", "p": "1"}
    assert generate.outputs == {"batch": ObjectRef("iter_000000/generate/batch.arrow", 1018, SHA)}
    assert generate.metrics["tok"] == 3 and generate.metrics["seconds"] == 0.1 + 0.2
    assert generate.finished_at == datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC)
    assert generate.ran_on == RanOn(pool="pool-a", worker=None, host="host-1", flow_run="fr-1")
    assert manifest.complete("reward") is None and manifest.stale_stages() == ["reward"]
    assert manifest.stages["reward"].ran_on is None
    assert manifest.repairs == (
        Repair(
            "iter_000000/generate/batch.arrow",
            "has sha256 ab, its reference says cd",
            datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC),
        ),
    )
    assert manifest.repaired_keys() == {"iter_000000/generate/batch.arrow"}


def test_records_write_the_bytes_they_were_read_from() -> None:
    manifest = Manifest.from_dict(json.loads(STORED_MANIFEST))
    assert json_bytes(manifest.to_dict()) == STORED_MANIFEST
    part = StageEntry.from_dict(json.loads(STORED_PART))
    assert json.dumps(part.to_dict()).encode() == STORED_PART
    stale = json.loads(STORED_PART) | {"status": "stale"}  # how a stale mark was written
    assert json.dumps(part.marked_stale().to_dict()) == json.dumps(stale)


def test_a_stored_part_entry_counts_only_with_intact_outputs(tmp_path: Path) -> None:
    storage = _stored_run(tmp_path)
    assert storage.completed_part(0, "reward", "shard-0-of-2", {"g": "x"}) is None  # no output
    storage.mark_stale(0, ["reward"])
    stored = tmp_path / "runs/old/iter_000000/reward/shard-0-of-2.entry.json"
    assert json.loads(stored.read_bytes())["status"] == "stale"


def test_a_commit_keeps_what_the_stored_manifest_held(tmp_path: Path) -> None:
    storage = _stored_run(tmp_path)
    ref = storage.write_json(0, "train", "metrics", {"loss": 1.0})
    storage.record_stage(0, "train", {"config": "c"}, {"metrics": ref})
    committed = json.loads((tmp_path / "runs/old/iter_000000/MANIFEST.json").read_bytes())
    before = json.loads(STORED_MANIFEST)
    assert {k: v for k, v in committed["stages"].items() if k != "train"} == before["stages"]
    assert committed["repairs"] == before["repairs"]


def test_marking_stale_changes_only_complete_entries() -> None:
    manifest = Manifest.from_dict(json.loads(STORED_MANIFEST))
    assert manifest.with_stale(["reward", "missing"]) is None  # nothing to change
    marked = manifest.with_stale(["generate"])
    assert marked is not None and sorted(marked.stale_stages()) == ["generate", "reward"]
    assert manifest.complete("generate") is not None, "records are never changed in place"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda m: m["stages"]["generate"].pop("outputs"), "lacks ['outputs']"),
        (lambda m: m["stages"]["generate"].update(status="running"), "'running'"),
        (lambda m: m["stages"]["generate"].update(extra=1), "unknown keys ['extra']"),
        (lambda m: m["stages"]["generate"]["ran_on"].pop("host"), "lacks ['host']"),
        (lambda m: m.update(stages=[]), "stages is list"),
    ],
)
def test_a_malformed_manifest_is_refused_naming_the_object_and_the_field(
    tmp_path: Path, change, named: str
) -> None:
    stored = json.loads(STORED_MANIFEST)
    change(stored)
    path = tmp_path / "runs" / "bad" / "iter_000000" / "MANIFEST.json"
    path.parent.mkdir(parents=True)
    path.write_bytes(json_bytes(stored))
    with pytest.raises(IntegrityError, match=r"iter_000000/MANIFEST\.json is not a valid") as info:
        RunStorage(str(tmp_path), "bad").read_manifest(0)
    assert named in str(info.value)


def test_a_stage_run_record_round_trips(tmp_path: Path) -> None:
    storage = RunStorage(str(tmp_path), "beats")
    record = StageRun(RanOn("train-pool", "w-1", "host-1", "fr-2"), pid=42, ttl_s=30.0, beat=3)
    storage.write_stage_run(1, "train", record)
    assert storage.read_stage_run(1, "train") == record
    damaged = StageRun(record.ran_on, 42, 30.0, 4, DamagedInput("iter_000001/x/batch", "gone"))
    storage.write_stage_run(1, "train", damaged)
    assert storage.read_stage_run(1, "train") == damaged
    assert storage.read_stage_run(1, "reward") is None


def test_a_stage_run_across_ranks_records_how_many() -> None:
    stored = '{"pool": null, "worker": null, "host": "h", "flow_run": "fr", "ranks": 2}'
    ran_on = RanOn.from_dict(json.loads(stored))
    assert ran_on.ranks == 2 and json.dumps(ran_on.to_dict()) == stored
    assert "ranks" not in RanOn(None, None, "h", "fr").to_dict()  # one process: no key
