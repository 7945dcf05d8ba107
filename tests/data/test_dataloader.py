"""StatefulDataLoader: resuming from saved state yields exactly the uninterrupted sequence."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nemo_rl_core.data.dataloader import StatefulDataLoader


def _ids_loader(size: int, batch_size: int, **kwargs) -> StatefulDataLoader:
    return StatefulDataLoader(
        list(range(size)), batch_size, collate_fn=lambda items: list(items), **kwargs
    )


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(3, 40),
    batch_size=st.integers(1, 7),
    stop_after=st.integers(0, 25),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_resume_yields_exactly_the_uninterrupted_sequence(
    size, batch_size, stop_after, shuffle, drop_last, seed
):
    if drop_last and size < batch_size:
        return
    kwargs = {"shuffle": shuffle, "drop_last": drop_last, "seed": seed}
    uninterrupted = _ids_loader(size, batch_size, **kwargs)
    expected = [uninterrupted.next_batch() for _ in range(stop_after + 10)]

    first = _ids_loader(size, batch_size, **kwargs)
    seen = [first.next_batch() for _ in range(stop_after)]
    state = json.loads(json.dumps(first.state_dict()))  # what a checkpoint stores
    resumed = _ids_loader(size, batch_size, **kwargs)
    resumed.load_state_dict(state)
    seen += [resumed.next_batch() for _ in range(10)]
    assert seen == expected


def test_epochs_cover_the_dataset_in_new_orders():
    loader = _ids_loader(10, 5, seed=3)
    epoch0 = list(loader)
    epoch1 = list(loader)
    assert sorted(sum(epoch0, [])) == sorted(sum(epoch1, [])) == list(range(10))
    assert epoch0 != epoch1 and len(epoch0) == len(loader) == 2
    assert loader.state_dict()["epoch"] == 1


def test_drop_last_skips_the_partial_batch():
    loader = _ids_loader(7, 3, shuffle=False)
    assert list(loader) == [[0, 1, 2], [3, 4, 5]]
    assert loader.next_batch() == [0, 1, 2] and loader.epoch == 1
    keep = _ids_loader(7, 3, shuffle=False, drop_last=False)
    assert list(keep) == [[0, 1, 2], [3, 4, 5], [6]]


def test_state_from_another_dataset_is_refused():
    state = _ids_loader(10, 2).state_dict()
    with pytest.raises(ValueError, match="dataset_size=10"):
        _ids_loader(12, 2).load_state_dict(state)
    with pytest.raises(ValueError, match="seed"):
        _ids_loader(10, 2, seed=1).load_state_dict(state)


def test_state_is_small_and_json_serializable():
    state = _ids_loader(10, 2).state_dict()
    assert set(state) == {
        "epoch",
        "position",
        "seed",
        "shuffle",
        "batch_size",
        "drop_last",
        "dataset_size",
    }
    json.dumps(state)
