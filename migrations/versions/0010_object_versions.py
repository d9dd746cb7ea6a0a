"""One table of object versions: `objects` (immutable mounts' versions) and `catalog_entries`
(catalog=on mounts' keys) merged into `object_versions`, with what both held.

A key in both keeps the row written last (`checked_at` of `objects`, `written_at` of the
catalog); rows from `objects` are complete (a store's stat or a write told them).

Revision ID: 0010_object_versions
Revises: 0009_console_signed_out
Create Date: 2026-12-04
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_object_versions"
down_revision: str | Sequence[str] | None = "0009_console_signed_out"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Spelled out rather than imported, as in 0001: a migration records what was created then.
TIMESTAMP = sa.DateTime(timezone=True)
OBJECT_KEY = sa.Text().with_variant(sa.Text(collation="C"), "postgresql")
BATCH = 5000
COLUMNS = "mount_id, key, size, etag, last_modified, attrs, complete, written_at"


def _create(name: str) -> None:
    op.create_table(
        name,
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("etag", sa.Text(), nullable=False),
        sa.Column("last_modified", TIMESTAMP, nullable=False),
        sa.Column("attrs", sa.Text(), nullable=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("written_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f(f"fk_{name}_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("mount_id", "key", name=op.f(f"pk_{name}")),
    )


def _attrs(content_type: str | None, extra: str) -> str:
    """An `objects` row's content type and `extra` JSON as the catalog's `attrs` JSON."""
    attrs = json.loads(extra) if extra else {}
    if content_type:
        attrs["content_type"] = content_type
    return json.dumps(attrs, ensure_ascii=False, separators=(",", ":")) if attrs else "{}"


def upgrade() -> None:
    _create("object_versions")
    conn = op.get_bind()
    conn.execute(
        sa.text(f"INSERT INTO object_versions ({COLUMNS}) SELECT {COLUMNS} FROM catalog_entries")
    )
    # `objects` rows, in key order a batch at a time (a table of millions is not held whole):
    # each becomes a row, or replaces the catalog's row of its key when written later.
    select = sa.text(
        "SELECT mount_id, key, size, etag, last_modified, content_type, extra, checked_at"
        " FROM objects WHERE mount_id > :m OR (mount_id = :m AND key > :k)"
        " ORDER BY mount_id, key LIMIT :n"
    )
    # Untyped columns: each value goes back as the dialect gave it (SQLite's text timestamps).
    t = sa.table("object_versions", *(sa.column(c) for c in COLUMNS.split(", ")))
    written = sa.text("SELECT written_at FROM object_versions WHERE mount_id = :m AND key = :k")
    after: tuple[int, str] = (-1, "")
    while True:
        rows = conn.execute(select, {"m": after[0], "k": after[1], "n": BATCH}).all()
        if not rows:
            break
        for mount_id, key, size, etag, modified, content_type, extra, checked_at in rows:
            row = {
                "mount_id": mount_id,
                "key": key,
                "size": size,
                "etag": etag,
                "last_modified": modified,
                "attrs": _attrs(content_type, extra),
                "complete": True,
                "written_at": checked_at,
            }
            catalogued = conn.execute(written, {"m": mount_id, "k": key}).scalar()
            if catalogued is None:
                conn.execute(sa.insert(t).values(row))
            elif _naive(catalogued) < _naive(checked_at):
                conn.execute(
                    sa.update(t)
                    .where(t.c.mount_id == mount_id, t.c.key == key)
                    .values({k: v for k, v in row.items() if k not in ("mount_id", "key")})
                )
        after = (rows[-1][0], rows[-1][1])
    op.drop_table("catalog_entries")
    op.drop_table("objects")


def _naive(value: object) -> object:
    """A timestamp comparable whichever way the dialect returned it (SQLite: text or naive)."""
    if isinstance(value, str):
        return value.replace("T", " ")[:26]
    return value.replace(tzinfo=None) if hasattr(value, "replace") else value


def downgrade() -> None:
    _create("catalog_entries")
    op.create_table(
        "objects",
        sa.Column("mount_id", sa.Integer(), nullable=False),
        sa.Column("key", OBJECT_KEY, nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("etag", sa.Text(), nullable=False),
        sa.Column("last_modified", TIMESTAMP, nullable=False),
        sa.Column("content_type", sa.Text(), nullable=True),
        sa.Column("extra", sa.Text(), nullable=False),
        sa.Column("checked_at", TIMESTAMP, nullable=False),
        sa.ForeignKeyConstraint(
            ["mount_id"],
            ["mounts.id"],
            name=op.f("fk_objects_mount_id_mounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("mount_id", "key", name=op.f("pk_objects")),
    )
    conn = op.get_bind()
    conn.execute(
        sa.text(f"INSERT INTO catalog_entries ({COLUMNS}) SELECT {COLUMNS} FROM object_versions")
    )
    # Complete rows of immutable mounts (metadata_ttl=-1) were what `objects` held.
    mounts = sa.text("SELECT id, options FROM mounts")
    immutable = []
    for mount_id, options in conn.execute(mounts):
        try:
            ttl = json.loads(options or "{}").get("metadata_ttl")
        except ValueError:
            continue
        if ttl is not None and float(ttl) < 0:
            immutable.append(mount_id)
    rows = conn.execute(
        sa.text(
            "SELECT mount_id, key, size, etag, last_modified, attrs, written_at"
            " FROM object_versions WHERE complete"
        )
    ).all()
    names = ("mount_id", "key", "size", "etag", "content_type", "extra", "last_modified")
    t = sa.table("objects", *(sa.column(c) for c in (*names, "checked_at")))
    for mount_id, key, size, etag, modified, attrs, written_at in rows:
        if mount_id not in immutable:
            continue
        extra = json.loads(attrs)
        content_type = extra.pop("content_type", None)
        extra.pop("checksums", None)
        conn.execute(
            sa.insert(t).values(
                mount_id=mount_id,
                key=key,
                size=size,
                etag=etag,
                last_modified=modified,
                content_type=content_type,
                checked_at=written_at,
                extra=json.dumps(extra, ensure_ascii=False, sort_keys=True, separators=(",", ":")),
            )
        )
    op.drop_table("object_versions")
