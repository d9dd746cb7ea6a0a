"""The console's pure parts: sessions (signature, expiry, CSRF tokens) and the fleet page's
rates from samples (consecutive samples of one worker; workers add up; a restart counts from
zero) and sparklines."""

from __future__ import annotations

from typing import Any

from gateway.console.figures import BINS, WINDOW, series, sparkline
from gateway.console.sessions import Sessions

KEY = b"k" * 32


def test_a_session_is_read_back_until_it_expires() -> None:
    now = [1000.0]
    sessions = Sessions(KEY, clock=lambda: now[0])
    session, cookie = sessions.issue("GKADMIN", ttl=60)
    assert sessions.read(cookie) == session and session.signed_in
    now[0] += 59.9
    assert sessions.read(cookie) == session
    now[0] += 0.1
    assert sessions.read(cookie) is None


def test_a_cookie_signed_otherwise_or_altered_is_refused() -> None:
    sessions = Sessions(KEY)
    _, cookie = sessions.issue("GKADMIN")
    payload, signature = cookie.split(".")
    _, other = Sessions(b"x" * 32).issue("GKADMIN")
    _, anonymous = sessions.issue()
    for bad in (other, f"{anonymous.split('.')[0]}.{signature}", f"{payload}x.{signature}",
                f"{payload}.", "", "a.b.c", "%%%.%%%"):  # fmt: skip
        assert sessions.read(bad) is None, bad


def test_csrf_tokens_belong_to_their_session() -> None:
    sessions = Sessions(KEY)
    one, _ = sessions.issue("GKADMIN")
    two, _ = sessions.issue("GKADMIN")
    assert sessions.csrf_ok(one, sessions.csrf_token(one))
    assert not sessions.csrf_ok(one, sessions.csrf_token(two))
    assert not sessions.csrf_ok(one, None) and not sessions.csrf_ok(one, "")


def sample(node: str, worker: int, at: float, requests: int, hits: int = 0, misses: int = 0,
           cache: int = 0) -> dict[str, Any]:  # fmt: skip
    """A row as NodeRegistry.samples returns it."""
    return {
        "node_id": node, "worker": worker, "at": at, "requests": requests, "sent_bytes": 0,
        "hits": hits, "misses": misses, "cache_bytes": cache, "capacity_bytes": 100,
    }  # fmt: skip


def test_rates_come_from_consecutive_samples_and_workers_add_up() -> None:
    now = 10_000.0
    rows = [
        sample("a", 1, now - 10, 100, hits=0, misses=0),
        sample("a", 1, now - 5, 150, hits=30, misses=10, cache=40),  # 10/s
        sample("a", 2, now - 10, 0),
        sample("a", 2, now - 5, 25, cache=40),  # 5/s
        sample("b", 7, now - 10, 500),
        sample("b", 7, now - 5, 20),  # restarted: 20 since
    ]
    found = series(now, rows)
    assert found["a"].requests_now == 15.0
    assert found["a"].requests_per_s[BINS - 1] == 15.0
    assert found["a"].hit_ratio[BINS - 1] == 0.75
    assert found["a"].cache_bytes[BINS - 1] == 40.0
    assert found["a"].capacity_bytes == 100
    assert found["b"].requests_now == 4.0
    assert found["a"].requests_per_s[0] is None


def test_old_samples_fall_into_their_bins_and_stale_ones_give_no_rate_now() -> None:
    now = 10_000.0
    rows = [sample("a", 1, now - WINDOW + 1, 0), sample("a", 1, now - WINDOW + 31, 300)]
    found = series(now, rows)["a"]
    assert found.requests_per_s[1] == 10.0 and found.requests_now is None


def test_a_sparkline_is_svg_with_gaps() -> None:
    assert "no samples" in sparkline([None, None])
    svg = sparkline([1.0, 2.0, None, 3.0, 4.0])
    assert svg.startswith("<svg") and svg.count("<polyline") == 2
    assert "<circle" in sparkline([None, 5.0, None])
