"""A scratch ext4 file system for a benchmark's many small files, made for one run and thrown
away whole: a million unlinks take minutes, an unmount and one unlink take seconds.

`Scratch(...).make()` creates a temporary folder `<prefix><pid>-XXXX` in `base` and in it a
sparse image file, formats it ext4 (`mkfs.ext4` with its default features, 4 KiB blocks,
256-byte inodes and a 1 GiB journal, as on a disk of 128 GiB or more; lazy init, so formatting
writes a few MB), and loop-mounts it (`mount -o loop`) at `<folder>/mnt`. `remove()`
unmounts it, deletes the image and the folder, and is safe to call twice and after a partial
`make()`. Where that cannot be done (not root, no loop devices, no ext4, no mount namespaces),
the files go into a plain folder as before, and `remove()` unlinks them one by one; `.note`
says which and why.

The mount is made in a mount namespace of this thread's own (unshare(CLONE_NEWNS), every mount
made private in it), not in the host's: a namespace made while a mount exists gets a copy of
it (`ip netns exec` makes one per command, and other benchmarks run that), and a copy keeps the
file system, its loop device and the deleted image alive until those processes end. In a
namespace of its own the mount is seen by this process and the children it starts afterwards
only. The thread returns to the host's namespace in `remove()`.

After a `kill -9`, the kernel undoes the mount when the last process in the namespace ends
(workers should die with their parent: `die_with_parent`), and `mount -o loop` marks the loop
device to detach itself when its file system goes. What is left is the folder with the image
in it; `remove_stale()` deletes such folders of this prefix whose process is gone (a folder
with a mount under it in this namespace is left alone: this module did not make that mount).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

_CLONE_NEWNS = 0x00020000
_PR_SET_PDEATHSIG = 1
_HELD = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM}  # ALRM: --max-minutes
# What mkfs.ext4 gives a disk of 128 GiB or more, as a node's cache disk is; for the image's
# size it would make 64 MiB, and the writers then stalled on its checkpoints (~20 % of their
# time, against ~10 % with this).
_JOURNAL_MIB = 1024
_libc = ctypes.CDLL(None, use_errno=True)


class Scratch:
    """A folder for files: on a loop-mounted ext4 image (`image`), or a plain one."""

    def __init__(
        self, base: Path | None, prefix: str, need: int, inodes: int, mode: str = "auto"
    ) -> None:
        """`need`: bytes the files take on disk; `inodes`: files and directories."""
        if mode not in ("auto", "image", "folder"):
            raise ValueError(f"mode {mode!r}: auto, image or folder")
        self.base, self.prefix, self.mode = base, prefix, mode
        self.need, self.inodes = need, inodes
        # Sparse: only what ext4 writes takes space, so room to spare costs nothing (and mkfs
        # wants the journal to be at most a quarter of it).
        self.image_bytes = max(2 * need, 3 * _JOURNAL_MIB * 2**20) + _JOURNAL_MIB * 2**20
        self.folder = ""  # the temporary folder: the image and its mount point, or the files
        self.root = ""  # where the files go
        self.image = ""  # the image file, while it exists
        self.device = ""  # the loop device, while mounted
        self.note = ""
        self._mnt = ""  # the mount point, once mount was started
        self._host_ns: int | None = None  # fd of the host's mount namespace, once unshared
        self._cwd = ""

    @property
    def is_image(self) -> bool:
        return bool(self.image)

    def make(self) -> Scratch:
        with held_signals():
            if self.base is not None:
                self.base.mkdir(parents=True, exist_ok=True)
            folder = tempfile.mkdtemp(prefix=f"{self.prefix}{os.getpid()}-", dir=self.base)
            self.folder = os.path.realpath(folder)  # as /proc/*/mountinfo spells it
            free = shutil.disk_usage(self.folder).free
            if free < self.need:
                self.remove()
                raise RuntimeError(
                    f"{free / 2**30:.1f} GiB free where the files go; they need "
                    f"~{self.need / 2**30:.1f} GiB (--dir elsewhere, or fewer --blocks)"
                )
            why = "--fs folder" if self.mode == "folder" else self._make_image()
            if why:
                if self.mode == "image":
                    self.remove()
                    raise RuntimeError(f"cannot make an ext4 image file system: {why}")
                self.root = self.folder
                self.note = f"a plain folder on {_fs_of(self.folder)} ({why})"
        return self

    def _make_image(self) -> str:
        """'' once mounted, else why not (and whatever was made is undone)."""
        missing = [t for t in ("mkfs.ext4", "mount", "umount") if shutil.which(t) is None]
        if os.geteuid() != 0:
            return "not root"
        if missing:
            return f"no {', '.join(missing)}"
        if not os.path.exists("/dev/loop-control"):
            return "no /dev/loop-control"
        free = shutil.disk_usage(self.folder).free
        if free < self.need + _JOURNAL_MIB * 2**20:
            return f"{free / 2**30:.1f} GiB free: not enough for the image and its journal"
        host = _fs_of(self.folder)
        try:
            self._unshare()
            image = os.path.join(self.folder, "fs.img")
            with open(image, "wb") as f:
                f.truncate(self.image_bytes)
            self.image = image
            # The default features; 4 KiB blocks and 256-byte inodes (nanosecond times) even
            # where the image is small enough for mkfs to pick its "small" type; formatting
            # writes a few MB (lazy init: the kernel is told not to zero the rest, see mount).
            lazy = "lazy_itable_init=1,lazy_journal_init=1,nodiscard"
            mkfs = ["mkfs.ext4", "-q", "-F", "-b", "4096", "-I", "256", "-m", "0", "-E", lazy]
            journal = f"size={_JOURNAL_MIB}"
            _run([*mkfs, "-J", journal, "-N", str(self.inodes), image])
            self._mnt = os.path.join(self.folder, "mnt")
            os.mkdir(self._mnt)
            # noinit_itable: no thread zeroing inode tables in the background while we measure
            _run(["mount", "-t", "ext4", "-o", "loop,noinit_itable", image, self._mnt])
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            self._undo_image()
            return str(exc)
        self.device = _mounts().get(self._mnt, "")
        self.root = self._mnt
        self.note = (
            f"ext4 in a sparse {self.image_bytes / 2**30:.0f} GiB image file on {host}, "
            f"{free / 2**30:.0f} GiB free, loop-mounted ({self.device or '?'}) in a mount "
            "namespace of its own"
        )
        return ""

    def _unshare(self) -> None:
        self._cwd = os.getcwd()
        host = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        if _libc.unshare(_CLONE_NEWNS) != 0:
            err = ctypes.get_errno()
            os.close(host)
            raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
        self._host_ns = host
        # Or a mount made here would propagate to the host's peers (systemd makes / shared).
        _run(["mount", "--make-rprivate", "/"])

    def remove(self, workers: int = 1) -> None:
        """Undo everything make() did; signals wait until it is done."""
        with held_signals():
            if self.image or self._host_ns is not None:
                self._undo_image()
            if self.folder and os.path.isdir(self.folder):
                remove_tree(self.folder, workers)
            self.folder = ""

    def _undo_image(self) -> None:
        device, image = self.device, self.image
        lazy = False
        mounted = self._mnt and self._mnt in _mounts()
        if mounted and _run(["umount", self._mnt], check=False).returncode != 0:
            # Busy (a file still open here): detached now, gone when its last file closes.
            lazy = _run(["umount", "-l", self._mnt], check=False).returncode == 0
        if self._mnt and self._mnt not in _mounts():
            with contextlib.suppress(OSError):
                os.rmdir(self._mnt)
        self.device = ""
        if image:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(image)
            self.image = ""
        if device and lazy:
            print(f"note: {device} detaches when this process has closed its files on it")
        elif device:
            _wait_detached(device, image)
        if self._host_ns is not None:
            self._setns_back()

    def _setns_back(self) -> None:
        assert self._host_ns is not None
        if _libc.setns(self._host_ns, _CLONE_NEWNS) != 0:
            err = ctypes.get_errno()  # EINVAL: threads started since share this thread's fs
            print(f"note: stays in its own mount namespace: setns: {os.strerror(err)}")
        else:
            os.close(self._host_ns)
            self._host_ns = None
        with contextlib.suppress(OSError):
            os.chdir(self._cwd)  # setns moves to the namespace's root


def remove_stale(
    base: Path | None, prefix: str, workers: int = 1, log: Callable[[str], None] = print
) -> None:
    """Delete the folders `<prefix><pid>-*` in base whose process is gone (a dead run's)."""
    where = os.path.realpath(base if base is not None else tempfile.gettempdir())
    pattern = re.compile(rf"{re.escape(prefix)}(\d+)-")
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(where):
            match = pattern.match(entry.name)
            if not match or not entry.is_dir(follow_symlinks=False):
                continue
            if os.path.exists(f"/proc/{match[1]}"):
                continue
            inside = [m for m in _mounts() if m == entry.path or m.startswith(entry.path + "/")]
            if inside:
                log(f"left {entry.path} alone: {inside[0]} is mounted there")
                continue
            log(f"removing {entry.path}, left by a dead run (pid {match[1]})")
            held = [d for d, f in _loop_backing() if f.startswith(entry.path + "/")]
            remove_tree(entry.path, workers)
            if held:
                log(f"{held[0]} still holds its image, until the processes using it end")


def remove_tree(root: str, workers: int) -> None:
    """rmtree, the subtrees a few levels down in parallel: a million unlinks are slow."""
    frontier = [root]
    for _ in range(6):
        deeper = [d for top in frontier for d in _subdirs(top)]
        if not deeper:
            break
        frontier = deeper
        if len(frontier) >= 256:
            break
    if workers > 1 and len(frontier) >= 64:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        fork = multiprocessing.get_context("fork")  # in this thread's mount namespace
        with ProcessPoolExecutor(
            workers, fork, initializer=die_with_parent, initargs=(os.getpid(),)
        ) as pool:
            list(pool.map(_rmtree, frontier, chunksize=16))
    shutil.rmtree(root, ignore_errors=True)


def _subdirs(path: str) -> list[str]:
    try:
        with os.scandir(path) as entries:
            return [e.path for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return []


def _rmtree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def die_with_parent(parent: int) -> None:
    """For a worker process: be killed when `parent`, the process that started it, dies (kill -9
    too)."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it died before that
        os._exit(1)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """Ctrl-C, SIGTERM, SIGHUP and SIGALRM wait (delivered after) while the block runs."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _run(cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {out.stderr.strip() or out.stdout.strip()}")
    return out


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), field)


def _mountinfo() -> Iterator[tuple[str, str, str]]:
    """(mount point, file system type, source) of each mount in this thread's namespace."""
    with open("/proc/thread-self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, after = left.split(), right.split()
            if len(fields) >= 5 and len(after) >= 2:
                yield _unescape(fields[4]), after[0], _unescape(after[1])


def _mounts() -> dict[str, str]:
    return {point: source for point, _, source in _mountinfo()}


def _fs_of(path: str) -> str:
    """'ext4 (/dev/vda)': the file system a path is on."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    for point, fstype, source in _mountinfo():
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, f"{fstype} ({source})"
    return kind


def _loop_backing() -> list[tuple[str, str]]:
    """(device, backing file) of every attached loop device."""
    out = []
    for path in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            name = path.read_text().strip().removesuffix(" (deleted)")
            out.append((f"/dev/{path.parent.parent.name}", name))
    return out


def _wait_detached(device: str, image: str, timeout: float = 10.0) -> None:
    """`mount -o loop` set the device to detach when its file system went; wait for that."""
    deadline = time.monotonic() + timeout
    while (device, image) in _loop_backing():
        if time.monotonic() > deadline:
            print(f"note: {device} still holds {image} (deleted); the kernel frees it later")
            return
        time.sleep(0.05)
