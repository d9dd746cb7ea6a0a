"""The schema as SQLAlchemy Core tables; migrations/ creates it, the store queries it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Dialect


class UTCDateTime(sa.TypeDecorator[datetime]):
    """A timestamp that is timezone-aware UTC in Python on every dialect.

    PostgreSQL stores timestamptz. SQLite has no time zones, so it stores naive UTC, and the
    zone is put back on the way out.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            # A naive time could be local or UTC; guessing would shift it by hours silently.
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


_SQLITE_TIME = "%Y-%m-%d %H:%M:%f"  # how SQLite's clock is written, so that times compare


def database_clock(dialect: str, ahead: float = 0.0) -> sa.ColumnElement[Any]:
    """The database's clock, `ahead` seconds on: no node's clock decides whose lease ran out.
    (A UTCDateTime column written with it on SQLite holds the same text, so times compare.)"""
    if dialect == "postgresql":
        return sa.func.now() + sa.literal(timedelta(seconds=ahead))
    return sa.func.strftime(_SQLITE_TIME, "now", f"{ahead:+.3f} seconds")


def object_key_type() -> sa.types.TypeEngine[Any]:
    """Text that sorts by UTF-8 bytes, as S3 lists keys.

    SQLite compares text with memcmp already; PostgreSQL needs the "C" collation, which also lets
    its primary-key index serve prefix scans.
    """
    return sa.Text().with_variant(sa.Text(collation="C"), "postgresql")


metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(column_0_label)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

mounts = sa.Table(
    "mounts",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("bucket", sa.String(255), nullable=False, unique=True),
    sa.Column("uri", sa.Text, nullable=False),
    # JSON object of str values; a secret's value is {"fernet": token} instead of the string.
    sa.Column("options", sa.Text, nullable=False),
    sa.Column("created_at", UTCDateTime, nullable=False),
    sa.Column("updated_at", UTCDateTime, nullable=False),
    # The user that owns the bucket (users.id; no foreign key, see 0007): its creator, or the
    # admin user for mounts made by the CLI. NULL: the admin user.
    sa.Column("owner_id", sa.Integer, nullable=True),
)

access_keys = sa.Table(
    "access_keys",
    metadata,
    sa.Column("access_key", sa.String(128), primary_key=True),
    sa.Column("secret_enc", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", UTCDateTime, nullable=False),
    # An admin key may also use the operator API (/_gateway/jobs); S3 requests do not ask.
    sa.Column("admin", sa.Boolean, nullable=False, server_default=sa.false()),
    # The user the key belongs to (users.id); NULL: the admin user. See docs/tenants.md.
    sa.Column("user_id", sa.Integer, nullable=True),
    # A disabled key authenticates nowhere (S3, the jobs API, the console) until enabled again.
    # False by the server's default only: an INSERT that names no `disabled` (create_key) also
    # works on a schema before 0008, as the tests of older migrations need.
    sa.Column("disabled", sa.Boolean, nullable=False, server_default=sa.false()),
)

# Tenants (docs/tenants.md): users, the custom policies (the built-in ones are in
# gateway/iam/builtin.py and have no rows), which policies each user holds, bucket policies.
users = sa.Table(
    "users",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("name", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", UTCDateTime, nullable=False),
)

policies = sa.Table(
    "policies",
    metadata,
    sa.Column("name", sa.String(128), primary_key=True),
    sa.Column("document", sa.Text, nullable=False),  # JSON, in the IAM grammar
    sa.Column("created_at", UTCDateTime, nullable=False),
)

user_policies = sa.Table(
    "user_policies",
    metadata,
    sa.Column(
        "user_id", sa.Integer, sa.ForeignKey("users.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("policy", sa.String(128), primary_key=True),  # a built-in's or a custom one's
)

bucket_policies = sa.Table(
    "bucket_policies",
    metadata,
    sa.Column(
        "mount_id", sa.Integer, sa.ForeignKey("mounts.id", ondelete="CASCADE"), primary_key=True
    ),
    sa.Column("document", sa.Text, nullable=False),  # JSON, as PutBucketPolicy was given it
    sa.Column("updated_at", UTCDateTime, nullable=False),
)

# Multipart uploads in progress: the under-store holds the parts' bytes, these tables hold what
# ListMultipartUploads and ListParts answer with, and map the client's upload id to the store's.
multipart_uploads = sa.Table(
    "multipart_uploads",
    metadata,
    # The id the client sees. It is ours, not the under-store's: the service generates it, so
    # that it can be unique across mounts and stores.
    sa.Column("upload_id", sa.Text, primary_key=True),
    sa.Column(
        "mount_id",
        sa.Integer,
        sa.ForeignKey("mounts.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("key", object_key_type(), nullable=False),
    sa.Column("store_upload_id", sa.Text, nullable=False),
    # JSON object: what CreateMultipartUpload was given (content type, user metadata, ...),
    # applied to the object when the upload completes.
    sa.Column("attrs", sa.Text, nullable=False),
    sa.Column("initiated_at", UTCDateTime, nullable=False),
    sa.Column("access_key", sa.Text, nullable=True),
    # Listing walks one mount's uploads in key order; leading with mount_id, it also serves the
    # cascade when a mount is removed.
    sa.Index("ix_multipart_uploads_mount_id_key_upload_id", "mount_id", "key", "upload_id"),
    # The reaper asks for the oldest uploads across all mounts.
    sa.Index("ix_multipart_uploads_initiated_at", "initiated_at"),
)

multipart_parts = sa.Table(
    "multipart_parts",
    metadata,
    sa.Column(
        "upload_id",
        sa.Text,
        sa.ForeignKey("multipart_uploads.upload_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("part_number", sa.Integer, primary_key=True),
    sa.Column("etag", sa.Text, nullable=False),  # quoted, as the client receives it
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("uploaded_at", UTCDateTime, nullable=False),
)

# The fleet's members (gateway.cluster.membership): each node upserts its row at start and
# heartbeats it; a node is live while its state is 'up' and its heartbeat is younger than the
# timeout, both judged by the database's clock so that the nodes' clocks never matter.
nodes = sa.Table(
    "nodes",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("address", sa.Text, nullable=False),  # host:port of the node's internal API
    sa.Column("weight", sa.Float, nullable=False),
    sa.Column("zone", sa.Text, nullable=False, server_default=""),
    sa.Column("state", sa.String(8), nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=False),
    sa.Column("heartbeat_at", UTCDateTime, nullable=False),
    # What `gateway status` shows of each node, as of its last heartbeat.
    sa.Column("cache_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("hits", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("misses", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("capacity_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("pinned_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("preload_fills", sa.BigInteger, nullable=False, server_default="0"),
    # The same per mount: a JSON list of objects (gateway/cluster/registry.MountLine).
    sa.Column("mounts", sa.Text, nullable=False, server_default="[]"),
    sa.CheckConstraint("state IN ('up', 'left')", name="state"),
)

# Each node's running totals at a heartbeat, at most one every SAMPLE_INTERVAL seconds
# (gateway/cluster/registry.py), for the console's charts of the last hour: rates are the
# differences of consecutive samples of one process (`worker`: its pid; a node with several
# workers writes a series per worker). `at` is the database's clock in seconds since the
# epoch; samples older than an hour are pruned as new ones are written.
node_samples = sa.Table(
    "node_samples",
    metadata,
    sa.Column("node_id", sa.Text, primary_key=True),
    sa.Column("worker", sa.Integer, primary_key=True),
    sa.Column("at", sa.Float, primary_key=True),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("sent_bytes", sa.BigInteger, nullable=False),
    sa.Column("hits", sa.BigInteger, nullable=False),
    sa.Column("misses", sa.BigInteger, nullable=False),
    sa.Column("cache_bytes", sa.BigInteger, nullable=False),
    sa.Column("capacity_bytes", sa.BigInteger, nullable=False),
    sa.Index("ix_node_samples_at", "at"),
)

# The console's sessions signed out before their expiry (gateway/console/sessions.py), by
# the nonce their cookie holds: a copy of the cookie is refused on every node and worker of
# the fleet. `expires` is the session's own (seconds since the epoch); rows are pruned an hour
# after it, as sign-outs are written.
console_signed_out = sa.Table(
    "console_signed_out",
    metadata,
    sa.Column("nonce", sa.Text, primary_key=True),
    sa.Column("expires", sa.Float, nullable=False),
    sa.Index("ix_console_signed_out_expires", "expires"),
)

# Uploads a node opened at an under-store on its own behalf (an S3 origin's multipart upload
# that streams a large PUT), held under a lease its writer renews: one whose lease ran out
# (its writer crashed) is aborted by a janitor. Leases run by the database's clock.
store_uploads = sa.Table(
    "store_uploads",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column(
        "mount_id",
        sa.Integer,
        sa.ForeignKey("mounts.id", ondelete="CASCADE"),
        nullable=False,
    ),
    sa.Column("key", object_key_type(), nullable=False),
    sa.Column("store_upload_id", sa.Text, nullable=False),
    sa.Column("owner", sa.Text, nullable=False),  # host:pid:token of the holder, for the log
    sa.Column("expires_at", UTCDateTime, nullable=False),
    sa.Index("ix_store_uploads_expires_at", "expires_at"),
)

# Preload jobs (gateway/jobs): a job, the objects its listing found (its work items), and each
# node's share of each batch of items, taken under a lease like the uploads above. The states
# are the ones of gateway/jobs/model.py.
jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("bucket", sa.String(255), nullable=False),
    sa.Column("prefix", object_key_type(), nullable=False),
    sa.Column("spec", sa.Text, nullable=False),  # JSON: the job's options (model.JobSpec)
    sa.Column("state", sa.String(10), nullable=False),
    sa.Column("message", sa.Text, nullable=False, server_default=""),
    sa.Column("submitted_by", sa.Text, nullable=False),
    sa.Column("submitted_at", UTCDateTime, nullable=False),
    sa.Column("started_at", UTCDateTime, nullable=True),
    sa.Column("ended_at", UTCDateTime, nullable=True),
    # The listing's holder: the one node that lists the prefix, until its lease runs out.
    sa.Column("lease_owner", sa.Text, nullable=True),
    sa.Column("lease_expires", UTCDateTime, nullable=True),
    sa.Column("total_objects", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("total_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.CheckConstraint(
        "state IN ('queued', 'listing', 'running', 'done', 'partial', 'failed', 'cancelled')",
        name="state",
    ),
    sa.Index("ix_jobs_state", "state"),
)

job_items = sa.Table(
    "job_items",
    metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),  # listing order; batch = seq // batch size
    sa.Column("key", object_key_type(), nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("etag", sa.Text, nullable=False),
)

# One row per (batch, node): that node's share of the batch (the blocks it owns), done by the
# node itself, or taken over by another once the node has left the fleet and its lease ran out.
job_work = sa.Table(
    "job_work",
    metadata,
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("batch", sa.Integer, primary_key=True),
    sa.Column("node_id", sa.Text, primary_key=True),
    sa.Column("state", sa.String(8), nullable=False),  # pending, leased, done
    sa.Column("lease_owner", sa.Text, nullable=True),
    sa.Column("lease_expires", UTCDateTime, nullable=True),
    sa.Column("cursor", sa.Integer, nullable=False, server_default="0"),  # items done, in order
    # Counted where the node is a block's first owner: the job's progress adds these up.
    sa.Column("objects", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("bytes", sa.BigInteger, nullable=False, server_default="0"),
    # What the node did for its share: fetched from the store, or found cached already.
    sa.Column("loaded_objects", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("loaded_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("cached_objects", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("cached_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("skipped", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("failures", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("unkept_bytes", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("full", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.CheckConstraint("state IN ('pending', 'leased', 'done')", name="state"),
)

# The first errors of a job, with their keys (a few per job: enough to say what went wrong).
job_errors = sa.Table(
    "job_errors",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    sa.Column("node_id", sa.Text, nullable=False),
    sa.Column("key", object_key_type(), nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("at", UTCDateTime, nullable=False),
    sa.Index("ix_job_errors_job_id", "job_id"),
)
