"""Read a whole Prefect listing: the server answers a filter with at most ``PAGE`` entries,
and a long run has more task runs, logs or artifacts than that."""

from collections.abc import Callable
from typing import TypeVar

PAGE = 200  # the most entries one /logs, /task_runs or /artifacts filter request returns
T = TypeVar("T")


def every_entry(read_page: Callable[[int], list[T]]) -> list[T]:
    """Every entry of a listing, read a page of ``PAGE`` at a time from the offset given."""
    entries: list[T] = []
    while True:
        page = read_page(len(entries))
        entries += page
        if len(page) < PAGE:
            return entries
