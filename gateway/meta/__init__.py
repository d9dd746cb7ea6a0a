"""The gateway's database: mounts, access keys, object metadata, uploads, key locks; secrets
encrypted."""

from . import catalog as catalog  # its tables join the schema (migrations compare with it)
from . import key_locks as key_locks  # as catalog
from . import versions as versions  # as catalog
from .engine import default_database_url, normalize_database_url
from .key_locks import HeldKey, KeyBusy, KeyLocks
from .migrate import SCHEMA_HEAD, head_revision, migrations_dir, run_migrations
from .models import (
    ADMIN_USER,
    SECRET_OPTIONS,
    USER_NAME,
    AccessKey,
    AccessKeyExists,
    InUse,
    MetaError,
    MetaUnavailable,
    Mount,
    MountExists,
    NoSuchPolicy,
    NoSuchUser,
    PolicyExists,
    TenancyRows,
    User,
    UserExists,
)
from .secrets import InvalidSecretKey, SecretBox, WrongSecretKey
from .signed_out import SignOuts
from .store import MetaStore, open_meta
from .uploads import PartRecord, StoreUploadRecord, UploadGone, UploadLeases, UploadRecord

__all__ = [
    "ADMIN_USER",
    "SCHEMA_HEAD",
    "SECRET_OPTIONS",
    "USER_NAME",
    "AccessKey",
    "AccessKeyExists",
    "HeldKey",
    "InUse",
    "InvalidSecretKey",
    "KeyBusy",
    "KeyLocks",
    "MetaError",
    "MetaStore",
    "MetaUnavailable",
    "Mount",
    "MountExists",
    "NoSuchPolicy",
    "NoSuchUser",
    "PartRecord",
    "PolicyExists",
    "SecretBox",
    "SignOuts",
    "StoreUploadRecord",
    "TenancyRows",
    "UploadGone",
    "UploadLeases",
    "UploadRecord",
    "User",
    "UserExists",
    "WrongSecretKey",
    "default_database_url",
    "head_revision",
    "migrations_dir",
    "normalize_database_url",
    "open_meta",
    "run_migrations",
]
