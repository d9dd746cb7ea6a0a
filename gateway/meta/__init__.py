"""The gateway's database: mounts, access keys, object metadata, uploads; secrets encrypted."""

from .engine import default_database_url, normalize_database_url
from .migrate import head_revision, migrations_dir, run_migrations
from .models import (
    SECRET_OPTIONS,
    AccessKey,
    AccessKeyExists,
    MetaError,
    MetaUnavailable,
    Mount,
    MountExists,
)
from .secrets import InvalidSecretKey, SecretBox, WrongSecretKey
from .store import MetaStore
from .uploads import PartRecord, UploadGone, UploadRecord

__all__ = [
    "SECRET_OPTIONS",
    "AccessKey",
    "AccessKeyExists",
    "InvalidSecretKey",
    "MetaError",
    "MetaStore",
    "MetaUnavailable",
    "Mount",
    "MountExists",
    "PartRecord",
    "SecretBox",
    "UploadGone",
    "UploadRecord",
    "WrongSecretKey",
    "default_database_url",
    "head_revision",
    "migrations_dir",
    "normalize_database_url",
    "run_migrations",
]
