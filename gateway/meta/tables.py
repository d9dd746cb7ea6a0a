"""The schema as SQLAlchemy Core tables; migrations/ creates it, the store queries it."""

from __future__ import annotations

from datetime import UTC, datetime
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
)

access_keys = sa.Table(
    "access_keys",
    metadata,
    sa.Column("access_key", sa.String(128), primary_key=True),
    sa.Column("secret_enc", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", UTCDateTime, nullable=False),
)

objects = sa.Table(
    "objects",
    metadata,
    sa.Column(
        "mount_id",
        sa.Integer,
        sa.ForeignKey("mounts.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("key", object_key_type(), primary_key=True),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("etag", sa.Text, nullable=False),
    sa.Column("last_modified", UTCDateTime, nullable=False),
    sa.Column("content_type", sa.Text, nullable=True),
    # JSON object: the other ObjectInfo fields that are set, user metadata under "metadata".
    sa.Column("extra", sa.Text, nullable=False),
    sa.Column("checked_at", UTCDateTime, nullable=False),
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
    sa.CheckConstraint("state IN ('up', 'left')", name="state"),
)
