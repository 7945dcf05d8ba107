"""A resume keeps the identity keys (model, data) of the run it continues; a key a newer
release adds, left unset, is not a change."""

from types import SimpleNamespace

import pytest

from flows.run_setup import check_same_identity
from nemo_rl_core.utils.config import ConfigError

PIPELINE = SimpleNamespace(identity_keys=("policy.model_name", "data"))
STORED = {"policy": {"model_name": "m"}, "data": {"train": [{"dataset_name": "addition"}]}}


def test_a_key_added_since_unset_still_resumes_and_a_set_one_is_refused() -> None:
    added = {**STORED, "data": {**STORED["data"], "val_data_paths": None}}
    check_same_identity(PIPELINE, STORED, added, "r")  # a run started before the key existed
    changed = {**STORED, "data": {**STORED["data"], "val_data_paths": {"held": "x.jsonl"}}}
    with pytest.raises(ConfigError, match="run 'r' was started with a different data"):
        check_same_identity(PIPELINE, STORED, changed, "r")
    seed = {**STORED, "data": {"train": [{"dataset_name": "addition", "seed": 2}]}}
    with pytest.raises(ConfigError, match="different data"):
        check_same_identity(PIPELINE, STORED, seed, "r")
