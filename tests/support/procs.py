"""Every server process the harness starts (gateway nodes, moto, Azurite, ...) leads a process
group of its own, which the harness ends with all its members (a node's workers too): when the
fixture stops it, at the session's end, and, when the test process ends without cleaning up
(pytest-timeout's thread method calls os._exit; a SIGKILL), by a reaper process that outlives
it and ends every group it was told of as soon as the test process is gone. What is not a
process of ours (a container the engine runs) is ended by a command registered the same way.

With pytest-timeout's signal method (the default, and what pyproject.toml uses) a timeout is an
exception in the test or its fixture, so finalizers run; but it can land between a server's
start and the fixture's yield, or in a finalizer's wait: the groups left are ended at the end.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from typing import IO, Any

# Groups started and not yet ended, by their leader's pid (the group's id).
_GROUPS: set[int] = set()
# Commands that end something else the harness started (`docker rm -f NAME`), by a name.
_CLEANUPS: dict[str, list[str]] = {}
_LOCK = threading.Lock()
_reaper: subprocess.Popen[bytes] | None = None


def start(cmd: list[str], **popen: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(cmd, **popen)` as the leader of a new process group (and session, so
    that a terminal's Ctrl-C reaches the harness, which ends it, not the server directly)."""
    proc: subprocess.Popen[bytes] = subprocess.Popen(cmd, start_new_session=True, **popen)
    with _LOCK:
        _GROUPS.add(proc.pid)
        _tell(f"+{proc.pid}")
    return proc


def end(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL what is left of `proc`'s group (a stop that ended the leader may leave none;
    a stop interrupted by a timeout may leave all), and reap the leader."""
    with _LOCK:
        known = proc.pid in _GROUPS
        _GROUPS.discard(proc.pid)
        # Until its leader is reaped, no other group can have its id.
        if known or proc.returncode is None:
            _kill_group(proc.pid)
        if known:
            _tell(f"-{proc.pid}")
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def cleanup_at_end(name: str, argv: list[str]) -> None:
    """Run `argv` at the end (the session's, or the test process's however it ends) unless
    `ended(name)` is called first: for what the harness starts that is no process of its
    own, such as a container."""
    with _LOCK:
        _CLEANUPS[name] = argv
        _tell("!" + json.dumps([name, argv]))


def ended(name: str) -> None:
    """`name`'s cleanup is done (or not needed): not run at the end."""
    with _LOCK:
        if _CLEANUPS.pop(name, None) is not None:
            _tell("?" + json.dumps(name))


def end_all() -> None:
    """End every group still running and run the cleanups left: at the session's end and at
    the interpreter's exit."""
    with _LOCK:
        for group in sorted(_GROUPS):
            _kill_group(group)
            _tell(f"-{group}")
        _GROUPS.clear()
        cleanups = list(_CLEANUPS.items())
        _CLEANUPS.clear()
    for name, argv in cleanups:
        _run_quietly(argv)
        with _LOCK:
            _tell("?" + json.dumps(name))


def _run_quietly(argv: list[str]) -> None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(argv, capture_output=True, timeout=60)


def running() -> set[int]:
    """The groups started and not yet ended (their leaders' pids)."""
    with _LOCK:
        return set(_GROUPS)


def _kill_group(group: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def _tell(line: str) -> None:
    """Tell the reaper of a group started (+) or ended (-); started at the first group."""
    global _reaper
    if _reaper is None or _reaper.poll() is not None:
        _reaper = subprocess.Popen(
            [sys.executable, __file__],
            stdin=subprocess.PIPE,
            start_new_session=True,  # not in the test process's group: it must outlive it
        )
        for group in _GROUPS:
            _send(_reaper, f"+{group}")
        for name, argv in _CLEANUPS.items():
            _send(_reaper, "!" + json.dumps([name, argv]))
    _send(_reaper, line)


def _send(reaper: subprocess.Popen[bytes], line: str) -> None:
    assert reaper.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        reaper.stdin.write(f"{line}\n".encode())
        reaper.stdin.flush()


def reap(lines: IO[str]) -> None:
    """The reaper's loop: follow the groups the test process tells of until its end of the
    pipe closes, which happens however that process ends, then end the groups left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the test process
    groups: set[int] = set()
    cleanups: dict[str, list[str]] = {}
    for line in lines:
        sign, rest = line[:1], line[1:]
        if sign == "+":
            groups.add(int(rest))
        elif sign == "-":
            groups.discard(int(rest))
        elif sign == "!":
            name, argv = json.loads(rest)
            cleanups[name] = argv
        elif sign == "?":
            cleanups.pop(json.loads(rest), None)
    for group in groups:
        _kill_group(group)
    for argv in cleanups.values():
        _run_quietly(argv)


atexit.register(end_all)

if __name__ == "__main__":
    reap(sys.stdin)
