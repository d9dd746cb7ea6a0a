"""gateway.threadnames: a thread's OS name, as top -H and /proc show it."""

from __future__ import annotations

import threading
from pathlib import Path

from gateway.threadnames import name_this_thread


def test_a_thread_names_itself_for_the_os_truncated_to_fifteen_bytes() -> None:
    seen: list[str] = []

    def run() -> None:
        name_this_thread("cache-janitor-and-more")
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == ["cache-janitor-a\n"]
