"""The sliding-tile puzzle of NeMo RL (``nemo_rl.environments.games.sliding_puzzle``).

A multi-turn game: the board is shuffled from the solved state by ``shuffle_moves``
random moves drawn from a seed (so a seed is one exact game), the model answers with
``<action>slide r c</action>`` (move the tile at row r, column c, 1-based, into the empty
cell) or ``<action>view</action>``, and the environment answers with the new board.
Reward 1.0 when the board is solved; an illegal or unreadable action is answered with an
explanation and costs one of the ``max_moves`` turns, never an exception.
"""

import copy
import random
import re
from collections import deque
from typing import Any, TypedDict

import torch

from nemo_rl_core.data.interfaces import LLMMessageLogType
from nemo_rl_core.distributed.batched_data_dict import BatchedDataDict
from nemo_rl_core.environments.config import SlidingPuzzleConfig, SlidingPuzzleEnvConfig
from nemo_rl_core.environments.interfaces import EnvironmentInterface, EnvironmentReturn
from nemo_rl_core.environments.metrics import reward_metrics

ACTION_STOP_STRINGS = ["</action>"]
_ACTION = re.compile(r"<action>(.*?)(?:</action>|$)", re.DOTALL)
_SLIDE = re.compile(r"^slide\s+(\d+)\s+(\d+)$")


class SlidingPuzzleMetadata(TypedDict):
    game_state: dict[str, Any]
    num_moves: int
    max_moves: int


class SlidingPuzzleGameLogic:
    """Pure game rules: generate, render, and apply one action to a game state."""

    @staticmethod
    def generate(config: SlidingPuzzleConfig | dict[str, Any], seed: int) -> dict[str, Any]:
        """A board shuffled by ``shuffle_moves`` random legal moves from the solved one."""
        config = SlidingPuzzleConfig.model_validate(config)
        size = config.size
        solution = [[r * size + c + 1 for c in range(size)] for r in range(size)]
        solution[-1][-1] = 0
        grid = copy.deepcopy(solution)
        empty = (size - 1, size - 1)
        rng = random.Random(seed)
        previous = None
        for _ in range(config.shuffle_moves):
            options = [pos for pos in _neighbours(empty, size) if pos != previous]
            tile = rng.choice(options)
            grid[empty[0]][empty[1]], grid[tile[0]][tile[1]] = grid[tile[0]][tile[1]], 0
            previous, empty = empty, tile
        return {"size": size, "grid": grid, "solution": solution, "empty_pos": list(empty)}

    @staticmethod
    def optimal_actions(game_state: dict[str, Any]) -> list[str]:
        """The shortest action list that solves the board (breadth-first search).

        A reference player for tests and SFT warm-up data; practical for shuffles of up to
        ~20 moves on 3x3 boards.
        """
        size = game_state["size"]
        start = tuple(v for row in game_state["grid"] for v in row)
        goal = tuple(v for row in game_state["solution"] for v in row)
        parents: dict[tuple[int, ...], tuple[tuple[int, ...], str] | None] = {start: None}
        queue = deque([start])
        while queue and goal not in parents:
            board = queue.popleft()
            empty = divmod(board.index(0), size)
            for y, x in _neighbours(empty, size):
                nxt = list(board)
                nxt[empty[0] * size + empty[1]], nxt[y * size + x] = nxt[y * size + x], 0
                key = tuple(nxt)
                if key not in parents:
                    parents[key] = (board, f"slide {y + 1} {x + 1}")
                    queue.append(key)
        if goal not in parents:
            raise ValueError("the board cannot be solved (tiles out of reachable order)")
        actions, board = [], goal
        while (link := parents[board]) is not None:
            board, action = link
            actions.append(action)
        return actions[::-1]

    @staticmethod
    def is_solved(game_state: dict[str, Any]) -> bool:
        return game_state["grid"] == game_state["solution"]

    @staticmethod
    def render(game_state: dict[str, Any]) -> str:
        width = len(str(game_state["size"] ** 2 - 1))
        return "\n".join(
            " ".join(str(v).rjust(width) if v else "_".rjust(width) for v in row)
            for row in game_state["grid"]
        )

    @staticmethod
    def init(game_state: dict[str, Any]) -> str:
        """The opening instructions and board."""
        size = game_state["size"]
        return (
            f"Solve the {size}x{size} sliding puzzle: put the tiles in order 1 to {size * size - 1} "
            "row by row with the empty cell (_) last.\n"
            "Answer with <action>slide r c</action> to move the tile at row r, column c "
            f"(1 to {size}) into the empty cell next to it, or <action>view</action>.\n"
            f"Board:\n{SlidingPuzzleGameLogic.render(game_state)}\n"
        )

    @staticmethod
    def step(action: str, game_state: dict[str, Any]) -> tuple[str, float, bool, dict[str, Any]]:
        """Apply ``action``: (answer text, reward, solved, new state). Never raises on bad input."""
        size = game_state["size"]
        command = " ".join(action.strip().lower().split())
        if command == "view":
            return f"Board:\n{SlidingPuzzleGameLogic.render(game_state)}\n", 0.0, False, game_state
        match = _SLIDE.match(command)
        if match is None:
            return (
                f"Invalid action {action.strip()[:40]!r}: use 'slide r c' or 'view'.\n",
                0.0,
                False,
                game_state,
            )
        row, col = int(match.group(1)) - 1, int(match.group(2)) - 1
        empty = tuple(game_state["empty_pos"])
        if not (0 <= row < size and 0 <= col < size):
            text = f"Illegal move: ({row + 1}, {col + 1}) is off the {size}x{size} board.\n"
            return text, 0.0, False, game_state
        if (row, col) not in _neighbours(empty, size):
            text = (
                f"Illegal move: the tile at ({row + 1}, {col + 1}) is not next to the empty "
                f"cell at ({empty[0] + 1}, {empty[1] + 1}).\n"
            )
            return text, 0.0, False, game_state
        state = copy.deepcopy(game_state)
        grid = state["grid"]
        tile = grid[row][col]
        grid[empty[0]][empty[1]], grid[row][col] = tile, 0
        state["empty_pos"] = [row, col]
        solved = SlidingPuzzleGameLogic.is_solved(state)
        text = f"Moved tile {tile}. Board:\n{SlidingPuzzleGameLogic.render(state)}\n"
        if solved:
            text += "Solved!\n"
        return text, 1.0 if solved else 0.0, solved, state


def _neighbours(pos: tuple[int, int], size: int) -> list[tuple[int, int]]:
    r, c = pos
    steps = ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1))
    return [(y, x) for y, x in steps if 0 <= y < size and 0 <= x < size]


def parse_action(text: str) -> str | None:
    """The last ``<action>...</action>`` of a response (closing tag optional: it may be the stop)."""
    matches = _ACTION.findall(text)
    return matches[-1] if matches else None


class SlidingPuzzleEnv(EnvironmentInterface[SlidingPuzzleMetadata]):
    """Answers each sample's last assistant turn with the board after its action."""

    config_class = SlidingPuzzleEnvConfig

    def __init__(self, cfg: SlidingPuzzleEnvConfig | dict[str, Any] | None = None):
        self.cfg = SlidingPuzzleEnvConfig.model_validate(cfg or {})

    def step(
        self,
        message_log_batch: list[LLMMessageLogType],
        metadata: list[SlidingPuzzleMetadata],
        *args: Any,
        **kwargs: Any,
    ) -> EnvironmentReturn[SlidingPuzzleMetadata]:
        observations, rewards, terminateds = [], [], []
        new_metadata: list[SlidingPuzzleMetadata] = []
        for i, (log, meta) in enumerate(zip(message_log_batch, metadata, strict=True)):
            if "game_state" not in meta:
                raise KeyError(f"sample {i}: metadata has no 'game_state' (keys: {sorted(meta)})")
            last = log[-1]["content"] if log and log[-1]["role"] == "assistant" else ""
            action = parse_action(last)
            if action is None:
                text, reward, solved, state = (
                    "No action found: answer with <action>slide r c</action>.\n",
                    0.0,
                    False,
                    meta["game_state"],
                )
            else:
                text, reward, solved, state = SlidingPuzzleGameLogic.step(
                    action, meta["game_state"]
                )
            num_moves = meta.get("num_moves", 0) + 1
            max_moves = meta.get("max_moves", self.cfg.max_moves)
            done = solved or num_moves >= max_moves
            if done and not solved:
                text += f"Out of moves ({max_moves}).\n"
            observations.append({"role": "environment", "content": text})
            new_metadata.append(
                {"game_state": state, "num_moves": num_moves, "max_moves": max_moves}
            )
            rewards.append(reward)
            terminateds.append(done)
        return EnvironmentReturn(
            observations=observations,
            metadata=new_metadata,
            next_stop_strings=[ACTION_STOP_STRINGS] * len(rewards),
            rewards=torch.tensor(rewards, dtype=torch.float32),
            terminateds=torch.tensor(terminateds, dtype=torch.bool),
            answers=None,
        )

    def global_post_process_and_metrics(
        self, batch: BatchedDataDict
    ) -> tuple[BatchedDataDict, dict[str, Any]]:
        metrics = reward_metrics(batch)
        metrics["solve_rate"] = metrics.pop("accuracy")
        return batch, metrics
