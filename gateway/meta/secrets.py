"""Encryption of secrets at rest (mount credentials, S3 secret keys) with rotatable Fernet keys."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

KEY_FILE_NAME = "secret.key"


class InvalidSecretKey(ValueError):
    """Configured key material is not a Fernet key (32 url-safe base64-encoded bytes)."""


class WrongSecretKey(Exception):
    """A stored secret cannot be decrypted with any configured key."""


def _split_keys(text: str) -> list[str]:
    # Fernet keys are url-safe base64, so commas, whitespace and '#' comments cannot be part of one.
    lines = (line.partition("#")[0] for line in text.splitlines())
    return [key for line in lines for key in re.split(r"[\s,]+", line) if key]


class SecretBox:
    """Encrypts with the first key and decrypts with any, so keys can be rotated in place."""

    def __init__(self, keys: Sequence[str | bytes]) -> None:
        if isinstance(keys, str | bytes):
            # A lone key would otherwise be taken as a sequence of one-character keys.
            keys = [keys]
        if not keys:
            raise InvalidSecretKey("no secret key given")
        fernets = []
        for index, key in enumerate(keys):
            try:
                fernets.append(Fernet(key))
            except (ValueError, TypeError) as exc:
                raise InvalidSecretKey(
                    f"secret key #{index + 1} is not a Fernet key "
                    "(32 url-safe base64-encoded bytes; make one with `Fernet.generate_key()`)"
                ) from exc
        self._fernet = MultiFernet(fernets)
        first = keys[0]
        self._first = base64.urlsafe_b64decode(
            first if isinstance(first, bytes) else first.encode()
        )

    @classmethod
    def from_config(cls, key: str | None, key_file: Path | None, data_dir: Path) -> SecretBox:
        """Explicit key(s) > key file > <data_dir>/secret.key, created on first use.

        `key` and the key file may hold several keys (comma, space or line separated), newest
        first: that is how a key is rotated.
        """
        if key:
            return cls(_split_keys(key))
        if key_file is not None:
            return cls(_read_key_file(Path(key_file)))
        return cls(_read_key_file(_ensure_key_file(Path(data_dir) / KEY_FILE_NAME)))

    @staticmethod
    def generate_key() -> str:
        return Fernet.generate_key().decode("ascii")

    def derive(self, purpose: str) -> bytes:
        """A key of its own for `purpose` (HMAC-SHA256 of the name under the first key): the
        same on every node that shares the key, and never the key that encrypts secrets."""
        return hmac.new(self._first, b"gateway/" + purpose.encode(), hashlib.sha256).digest()

    def encrypt(self, plain: str) -> str:
        return self._fernet.encrypt(plain.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, UnicodeEncodeError) as exc:
            raise WrongSecretKey(
                "cannot decrypt a stored secret: it was encrypted with a key that is not "
                "configured (or it is corrupt); configure the key it was written with"
            ) from exc

    def rotate(self, token: str) -> str:
        """The token re-encrypted under the first key (WrongSecretKey if no key opens it)."""
        try:
            return self._fernet.rotate(token.encode("ascii")).decode("ascii")
        except (InvalidToken, UnicodeEncodeError) as exc:
            raise WrongSecretKey("cannot rotate a secret no configured key decrypts") from exc


def _read_key_file(path: Path) -> list[str]:
    try:
        keys = _split_keys(path.read_text(encoding="ascii"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSecretKey(f"cannot read secret key file {path}: {exc}") from exc
    if not keys:
        raise InvalidSecretKey(f"secret key file {path} holds no key")
    return keys


def _ensure_key_file(path: Path) -> Path:
    """Create the key file once, atomically, readable by its owner only.

    Written under a temporary name and linked into place: a reader never sees a partial key, and
    if two processes race, link() lets exactly one win and the other uses the winner's key.
    """
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp: a unique name (threads and processes may race here) created with mode 0600.
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(SecretBox.generate_key() + "\n")
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
