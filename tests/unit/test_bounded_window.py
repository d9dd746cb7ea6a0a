"""gateway.bounded.Window: the keys put within the last `limit` bytes, by their sizes."""

from __future__ import annotations

from gateway.bounded import Window


def test_a_key_is_kept_while_the_bytes_put_after_it_fit_the_limit() -> None:
    w = Window(150)
    w.put("f", 96)
    assert "f" in w
    w.put("g", 104)  # 200 bytes: f, the oldest, goes
    assert "f" not in w and "g" in w and w.total == 104
    w.put("f", 96)  # g goes in turn: a loop over more than the limit never finds its keys
    assert "g" not in w and "f" in w and w.total == 96


def test_a_key_put_again_counts_once_and_pop_gives_its_bytes_back() -> None:
    w = Window(100)
    w.put("a", 30)
    w.put("b", 30)
    w.put("a", 40)  # a's size replaced, a now the newest
    assert w.total == 70 and len(w) == 2
    w.put("c", 40)  # 110: b, the oldest now, goes; a stays
    assert "b" not in w and "a" in w and w.total == 80
    w.pop("a")
    w.pop("missing")
    assert w.total == 40 and "a" not in w


def test_a_key_larger_than_the_limit_is_not_kept() -> None:
    w = Window(64)
    w.put("big", 65)
    assert "big" not in w and w.total == 0
