"""missprofile --perf's split of a process's CPU below Python (loadtest/perfsplit.py): each
sample's part by its call chain, and a real process sampled by perf."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest import perfsplit

_K = "[kernel.kallsyms]"
_PY = "/usr/lib/libpython3.11.so.1.0"

# perf script -F comm,tid,ip,sym,dso, as perf prints it: a GIL wait on the loop's thread, a
# socket write that passes the VFS, a rename on a cache-io thread, Python code, libc (perf
# ends each first line with a space; the parser does not need it).
_SCRIPT = f"""python 101
\tffffffff8230b789 finish_task_switch.isra.0 ({_K})
\tffffffff8230b000 futex_wait ({_K})
\tffffffff8230a000 __x64_sys_futex ({_K})
\t7f00 __futex_abstimed_wait_common (/usr/lib/x86_64-linux-gnu/libc.so.6)
\t7f01 take_gil ({_PY})

python 101
\tffffffff8230b789 _raw_spin_unlock_irqrestore ({_K})
\tffffffff81f0fd3b sock_def_readable ({_K})
\tffffffff8211fd3d tcp_data_queue ({_K})
\tffffffff81f091dd sock_write_iter ({_K})
\tffffffff81f09000 vfs_write ({_K})

cache-io 102
\tffffffff81000000 ext4_rename ({_K})
\tffffffff81000100 vfs_rename ({_K})
\tffffffff81000200 do_renameat2 ({_K})

python 101
\t1bcf42 _PyEval_EvalFrameDefault ({_PY})
\t56141f4dba90 [unknown] ([unknown])

python 101
\t1bcf42 __memmove_avx_unaligned_erms (/usr/lib/x86_64-linux-gnu/libc.so.6)

python 101
\tffffffff81000000 do_epoll_wait ({_K})
"""


def test_each_sample_is_put_in_one_part_by_its_chain() -> None:
    by = perfsplit.parse(_SCRIPT)
    assert dict(by["python"]) == {
        "futex": 1, "network": 1, "interpreter": 1, "libraries": 1, "kernel, other": 1
    }  # fmt: skip
    assert dict(by["cache-io"]) == {"file": 1}
    shares = perfsplit.shares(by)
    assert shares["python"]["all"] == pytest.approx(5 / 6)
    assert shares["cache-io"]["file"] == pytest.approx(1 / 6)
    table = perfsplit.table(shares, 600.0)
    assert table.splitlines()[-1].split()[:3] == ["all", "threads", "600"]


# Python code and nothing else (no clock read: a process-time clock is a system call).
_SPIN = "for _ in range(3):\n    sum(i * i for i in range(1_000_000))\n"


@pytest.mark.skipif(not perfsplit.available(), reason="perf is not installed")
def test_a_process_running_python_is_mostly_the_interpreter(tmp_path: Path) -> None:
    # The child waits for a line before it spins, so perf is attached first; perf record -p
    # ends when the child does.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline()\n" + _SPIN],
        stdin=subprocess.PIPE,
    )
    data = tmp_path / "perf.data"
    sampler = perfsplit.record(child.pid, data)
    try:
        assert child.stdin is not None
        # perf has the process once its file has a header: wait for it, not for a time.
        deadline = time.monotonic() + 60
        while not (data.exists() and data.stat().st_size > 0):
            if sampler.poll() is not None or time.monotonic() > deadline:
                pytest.skip("perf could not trace the process here")
            time.sleep(0.05)
        child.stdin.write(b"go\n")
        child.stdin.flush()
        child.wait(timeout=60)
        sampler.wait(timeout=60)
    finally:
        child.kill()
        child.wait()
        perfsplit.stop(sampler)
    shares = perfsplit.shares(perfsplit.split(data))
    total = sum(row["all"] for row in shares.values())
    assert total == pytest.approx(1.0)
    interpreter = sum(row["interpreter"] for row in shares.values())
    assert interpreter > 0.5, shares
