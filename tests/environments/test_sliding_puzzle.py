"""Sliding puzzle: seeded games, an optimal scripted player, illegal moves, move limit."""

import pytest

from nemo_rl_core.environments.games.sliding_puzzle import (
    SlidingPuzzleEnv,
    SlidingPuzzleGameLogic,
    parse_action,
)
from nemo_rl_core.environments.utils import UnknownEnvironmentError, create_env


def _play(env, log, meta, text):
    log.append({"role": "assistant", "content": text})
    result = env.step([log], [meta])
    log.append(result.observations[0])
    return result, result.metadata[0]


def test_same_seed_same_game_and_shuffled():
    config = {"size": 3, "shuffle_moves": 12}
    first = SlidingPuzzleGameLogic.generate(config, seed=7)
    assert first == SlidingPuzzleGameLogic.generate(config, seed=7)
    assert first != SlidingPuzzleGameLogic.generate(config, seed=8)
    assert not SlidingPuzzleGameLogic.is_solved(first)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_optimal_scripted_policy_solves_with_reward_one(seed):
    env = create_env("sliding_puzzle_game", {"cfg": {"max_moves": 40}})
    state = SlidingPuzzleGameLogic.generate({"size": 3, "shuffle_moves": 14}, seed=seed)
    meta = {"game_state": state, "num_moves": 0, "max_moves": 40}
    log = [{"role": "user", "content": SlidingPuzzleGameLogic.init(state)}]
    actions = SlidingPuzzleGameLogic.optimal_actions(state)
    assert 0 < len(actions) <= 14, "optimal never exceeds the shuffle length"
    rewards = []
    for i, action in enumerate(actions):
        result, meta = _play(env, log, meta, f"I will move. <action>{action}</action>")
        rewards.append(result.rewards.item())
        assert result.terminateds.item() == (i == len(actions) - 1)
        assert result.next_stop_strings[0] == ["</action>"]
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0
    assert SlidingPuzzleGameLogic.is_solved(meta["game_state"])
    assert "Solved!" in log[-1]["content"]


def test_illegal_and_unreadable_moves_are_answered():
    env = SlidingPuzzleEnv({"max_moves": 10})
    state = SlidingPuzzleGameLogic.generate({"size": 3, "shuffle_moves": 0}, seed=0)
    meta = {"game_state": state, "num_moves": 0, "max_moves": 10}
    log = [{"role": "user", "content": SlidingPuzzleGameLogic.init(state)}]
    for text, expected in [
        ("<action>slide 1 1</action>", "not next to the empty cell"),
        ("<action>slide 9 9</action>", "off the 3x3 board"),
        ("<action>jump</action>", "Invalid action"),
        ("no tags at all", "No action found"),
        ("<action>view</action>", "Board:"),
    ]:
        result, meta = _play(env, log, meta, text)
        assert expected in result.observations[0]["content"]
        assert result.rewards.item() == 0.0 and not result.terminateds.item()
        assert meta["game_state"] == state
    assert meta["num_moves"] == 5


def test_running_out_of_moves_terminates_without_reward():
    env = SlidingPuzzleEnv({"max_moves": 2})
    state = SlidingPuzzleGameLogic.generate({"size": 3, "shuffle_moves": 20}, seed=3)
    meta = {"game_state": state, "num_moves": 0, "max_moves": 2}
    log = [{"role": "user", "content": "start"}]
    first, meta = _play(env, log, meta, "<action>view</action>")
    second, meta = _play(env, log, meta, "<action>view</action>")
    assert not first.terminateds.item() and second.terminateds.item()
    assert second.rewards.item() == 0.0
    assert "Out of moves" in second.observations[0]["content"]


def test_action_parsing_takes_the_last_action_and_tolerates_a_missing_close_tag():
    assert parse_action("<action>view</action> then <action>slide 1 2</action>") == "slide 1 2"
    assert parse_action("<action>slide 2 3") == "slide 2 3"
    assert parse_action("nothing") is None


def test_unknown_environment_is_named_with_the_known_ones():
    with pytest.raises(UnknownEnvironmentError, match="'chess'.*math.*sliding_puzzle_game"):
        create_env("chess", {})


def test_unknown_config_key_is_named():
    with pytest.raises(ValueError, match="max_move"):
        SlidingPuzzleEnv({"max_move": 3})
