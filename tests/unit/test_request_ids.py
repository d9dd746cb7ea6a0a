"""Request ids (gateway/s3/http.py): 16 hex digits, drawn without a system call, and not the
same in a forked worker as in its parent (the node's workers are forked)."""

from __future__ import annotations

import os
import re

from gateway.s3.http import new_request_id


def test_ids_are_sixteen_upper_hex_digits_and_do_not_repeat() -> None:
    ids = [new_request_id() for _ in range(10_000)]
    assert all(re.fullmatch(r"[0-9A-F]{16}", i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    new_request_id()  # the generator has state before the fork
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, "".join(new_request_id() for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        child = os.read(read, 64).decode()
    finally:
        os.close(read)
        os.waitpid(pid, 0)
    mine = "".join(new_request_id() for _ in range(4))
    assert len(child) == 64
    assert child != mine
