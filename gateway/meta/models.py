"""The values and errors the metadata store hands to the rest of the gateway."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

# Mount options whose values are credentials: encrypted at rest, masked when shown.
SECRET_OPTIONS = frozenset(
    {"secret_key", "account_key", "sas_token", "credentials_json", "session_token"}
)
MASK = "***"


@dataclass(frozen=True, slots=True)
class Mount:
    """A bucket the clients see, mapped to an under-store URI with its options."""

    id: int
    bucket: str
    uri: str
    options: Mapping[str, str]  # secrets decrypted: never log this, log public_options()
    created_at: datetime

    def public_options(self) -> dict[str, str]:
        """The options with secret values replaced by '***', fit for printing and listing."""
        return {k: MASK if k in SECRET_OPTIONS else v for k, v in self.options.items()}

    def __repr__(self) -> str:
        # Mounts end up in logs and tracebacks; the generated repr would print credentials.
        return (
            f"Mount(id={self.id!r}, bucket={self.bucket!r}, uri={self.uri!r}, "
            f"options={self.public_options()!r}, created_at={self.created_at!r})"
        )


@dataclass(frozen=True, slots=True)
class AccessKey:
    """An S3 access key pair clients sign requests with."""

    access_key: str
    secret_key: str = field(repr=False)
    created_at: datetime
    description: str = ""
    admin: bool = False  # may use the operator API (/_gateway/jobs) too
    user_id: int | None = None  # its user (None: the admin user)
    disabled: bool = False  # refused everywhere (S3, jobs API, console) until enabled again


class MetaError(Exception):
    """Base of the metadata store's errors."""


class MountExists(MetaError):
    """A mount for this bucket exists already."""


class AccessKeyExists(MetaError):
    """An access key with this id exists already."""


class MetaUnavailable(MetaError):
    """The database cannot be reached or is busy; retrying later may help."""


# IAM's user names: what `gateway users create` and the console accept.
USER_NAME = re.compile(r"[A-Za-z0-9_+=,.@-]{1,64}")

ADMIN_USER = "admin"  # the user every key and mount had before there were users (0007)


@dataclass(frozen=True, slots=True)
class User:
    """A tenant: its keys sign requests, its policies say what it may do."""

    id: int
    name: str
    created_at: datetime
    policies: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()  # access key ids
    buckets: tuple[str, ...] = ()  # the buckets it owns


@dataclass(frozen=True, slots=True)
class TenancyRows:
    """What authorization needs, read in one transaction: the request path compiles it."""

    admin_id: int | None
    users: dict[int, tuple[str, tuple[str, ...]]]  # id -> (name, policy names)
    key_users: dict[str, int | None]  # access key -> user id (None: the admin user)
    policies: dict[str, str]  # custom policy name -> document
    owners: dict[str, int | None]  # bucket -> owner's user id (None: the admin user)
    bucket_policies: dict[str, str]  # bucket -> document
    # When each user was created and each bucket policy stored: a bucket policy names users
    # by name, and grants a user of that name only if it existed when the policy was stored
    # (a name deleted and made again is another user, as IAM's unique ids make it).
    user_created: dict[int, datetime] = field(default_factory=dict)
    policy_stored: dict[str, datetime] = field(default_factory=dict)


class UserExists(MetaError):
    """A user of this name exists already."""


class NoSuchUser(MetaError):
    """No user of this name."""


class PolicyExists(MetaError):
    """A custom policy of this name exists already (or the name is a built-in's)."""


class NoSuchPolicy(MetaError):
    """No policy of this name."""


class InUse(MetaError):
    """The user owns buckets, or the policy is attached: the message says which."""
