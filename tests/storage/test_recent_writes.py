from nemo_rl_core.storage.recent_writes import RecentWrites


def test_a_write_is_found_by_its_key_size_and_sha256_only() -> None:
    recent = RecentWrites(max_bytes=100)
    recent.remember("iter_000000/generate/batch.arrow", "aa", b"0123")
    assert recent.get("iter_000000/generate/batch.arrow", 4, "aa") == b"0123"
    assert recent.get("iter_000000/generate/batch.arrow", 4, "bb") is None  # other bytes
    assert recent.get("iter_000000/generate/batch.arrow", 5, "aa") is None
    assert recent.get("iter_000000/reward/batch.arrow", 4, "aa") is None
    recent.remember("iter_000000/generate/batch.arrow", "bb", b"4567")  # rewritten
    assert recent.get("iter_000000/generate/batch.arrow", 4, "aa") is None
    assert recent.get("iter_000000/generate/batch.arrow", 4, "bb") == b"4567"


def test_the_oldest_writes_go_first_past_the_byte_budget() -> None:
    recent = RecentWrites(max_bytes=10)
    recent.remember("a", "1", b"aaaa")
    recent.remember("b", "2", b"bbbb")
    assert recent.get("a", 4, "1") == b"aaaa"  # read: now the newest
    recent.remember("c", "3", b"cccc")
    assert recent.get("b", 4, "2") is None
    assert recent.get("a", 4, "1") == b"aaaa" and recent.get("c", 4, "3") == b"cccc"
    recent.remember("big", "4", b"x" * 11)  # never kept: larger than the budget
    assert recent.get("big", 11, "4") is None and recent.get("c", 4, "3") == b"cccc"
    recent.forget()
    assert recent.get("a", 4, "1") is None and recent.get("c", 4, "3") is None


def test_a_zero_budget_keeps_nothing() -> None:
    recent = RecentWrites(max_bytes=0)
    recent.remember("a", "1", b"a")
    assert recent.get("a", 1, "1") is None


def test_a_discarded_key_is_read_from_the_store_again() -> None:
    recent = RecentWrites(max_bytes=10)
    recent.remember("a", "1", b"aaaa")
    recent.discard("a")
    recent.discard("never-written")
    assert recent.get("a", 4, "1") is None
