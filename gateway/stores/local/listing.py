"""Listing of the file store: a depth-first walk of its folder tree in S3 key order, pruned by
prefix, marker and delimiter."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

from gateway.stores.base import (
    ListPage,
    ObjectInfo,
    StoreAccessDenied,
    StoreMissing,
)
from gateway.stores.file_meta import DIR_MARKER, FOLDER_SELF, info_of, is_internal
from gateway.stores.listing import encode_token, rollup
from gateway.stores.local.tree import Tree, utf8


class _Entry(Protocol):
    """What a walk knows of a file or folder: an os.DirEntry, or an _Inner."""

    @property
    def path(self) -> str: ...

    def stat(self) -> os.stat_result: ...


class _Inner:
    """A folder's DIR_MARKER or FOLDER_SELF file, listed under the key it holds."""

    def __init__(self, path: str) -> None:
        self.path = path

    def stat(self) -> os.stat_result:
        return os.stat(self.path)


# An item of a walk: ("file", key, entry, ()) or ("dir", common prefix, entry, real paths from
# the root down to that directory, to follow symlinked directories without looping).
_Item = tuple[str, str, _Entry, tuple[str, ...]]
_Candidate = tuple[str, bool, str, _Entry]


def list_sync(tree: Tree, prefix: str, delimiter: str | None, marker: str, limit: int) -> ListPage:
    """Up to `limit` (> 0) entries after `marker` (run on a worker thread)."""
    if not os.path.isdir(tree.root):
        raise StoreMissing(f"file store root {tree.root} is not a directory")
    objects: list[ObjectInfo] = []
    prefixes: list[str] = []
    last = ""
    more = False
    walk = _Walk(tree, prefix, delimiter, marker)
    for kind, name, entry, chain in walk.items("", tree.root, (tree.real_root(),)):
        if kind == "dir":
            if name == last or name <= marker or not walk.has_file(entry.path, chain):
                continue
        elif delimiter is not None and (cp := walk.rollup(name)) is not None:
            if cp == last or cp <= marker:
                continue
            kind, name = "dir", cp
        if len(objects) + len(prefixes) == limit:
            more = True
            break
        if kind == "dir":
            prefixes.append(name)
        else:
            try:
                objects.append(info_of(name, entry.stat(), entry.path))
            except OSError:
                continue  # deleted since the directory was read
        last = name
    return ListPage(objects, prefixes, encode_token(last) if more else None)


class _Walk:
    """A depth-first walk of the tree in S3 key order, pruned by prefix, marker and delimiter."""

    def __init__(self, tree: Tree, prefix: str, delimiter: str | None, marker: str):
        self.tree = tree
        self.prefix = prefix
        self.delimiter = delimiter
        self.marker = marker

    def rollup(self, key: str) -> str | None:
        return rollup(key, self.prefix, self.delimiter)

    def _children(
        self, path: str, chain: tuple[str, ...]
    ) -> list[tuple[str, bool, str, os.DirEntry[str]]]:
        """Entries that can hold objects, as (name, is_dir, real path, entry), unsorted."""
        found = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    if not utf8(e.name) or is_internal(e.name):
                        continue
                    try:
                        is_dir = e.is_dir()
                        if not is_dir and not e.is_file():
                            continue
                        real = os.path.join(chain[-1], e.name)
                        if e.is_symlink():
                            real = os.path.realpath(e.path)
                            # Out of the root, or a loop back into the walk's own path.
                            if not self.tree.inside(real) or real in chain:
                                continue
                    except OSError:
                        continue
                    found.append((e.name, is_dir, real, e))
        except (FileNotFoundError, NotADirectoryError):
            return []  # removed while we walked
        except PermissionError as exc:
            raise StoreAccessDenied(f"cannot list {path}: {exc.strerror}") from None
        return found

    def _entries(self, dir_key: str, path: str, chain: tuple[str, ...]) -> list[_Candidate]:
        """This directory's candidates as (key, is_dir, real path, entry), sorted as S3 keys
        (a folder's marker `a/` just before the folder's own keys)."""
        found: list[_Candidate] = []
        for name, is_dir, real, e in self._children(path, chain):
            # A directory sorts as its name plus '/': 'a-c' < 'a/b' < 'a0'.
            key = f"{dir_key}{name}/" if is_dir else dir_key + name
            candidates: list[_Candidate] = [(key, is_dir, real, e)]
            if is_dir:
                # The folder's own key (`a` beside `a/b`) and its marker (`a/`), if kept.
                for inner, inner_key in ((FOLDER_SELF, key[:-1]), (DIR_MARKER, key)):
                    inner_path = os.path.join(e.path, inner)
                    if os.path.isfile(inner_path):
                        candidates.append((inner_key, False, real, _Inner(inner_path)))
            for candidate in candidates:
                ckey, cdir = candidate[0], candidate[1]
                if not ckey.startswith(self.prefix) and not (cdir and self.prefix.startswith(ckey)):
                    continue
                # Prune what lies wholly at or before the marker, subtrees included.
                if ckey <= self.marker and not (cdir and self.marker.startswith(ckey)):
                    continue
                found.append(candidate)
        found.sort(key=lambda f: (f[0], f[1]))
        return found

    def items(self, dir_key: str, path: str, ancestors: tuple[str, ...]) -> Iterator[_Item]:
        for key, is_dir, real, entry in self._entries(dir_key, path, ancestors):
            if not is_dir:
                yield "file", key, entry, ()
                continue
            cp = self.rollup(key)
            if cp is not None:
                # Every key below rolls up into the same prefix: no need to walk it all.
                yield "dir", cp, entry, (*ancestors, real)
            else:
                yield from self.items(key, entry.path, (*ancestors, real))

    def has_file(self, path: str, chain: tuple[str, ...]) -> bool:
        """Whether any regular file lies below `path` (empty folders produce no prefix)."""
        children = self._children(path, chain)
        if any(not is_dir for _, is_dir, _, _ in children):
            return True
        if os.path.isfile(os.path.join(path, DIR_MARKER)):
            return True  # the marker `a/` is a key under `a/`
        if any(os.path.isfile(os.path.join(e.path, FOLDER_SELF)) for _, _, _, e in children):
            return True
        return any(self.has_file(e.path, (*chain, real)) for _, _, real, e in children)
