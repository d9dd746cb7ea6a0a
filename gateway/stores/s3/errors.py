"""What an S3 origin's failed answer means as a store error: its status, its error code (the
XML body's, or the status for a body-less answer) and its headers, mapped in this one place for
the transport's reads and botocore's other calls alike."""

from __future__ import annotations

from collections.abc import Mapping

from gateway.stores.base import (
    InvalidVersionId,
    IsDeleteMarker,
    KeyTooLong,
    MarkedDeleted,
    MetadataTooLarge,
    NoSuchVersion,
    ObjectNotFound,
    StoreAccessDenied,
    StoreError,
    StoreMissing,
    StoreRejected,
    StoreUnavailable,
    VersionChanged,
)

NOT_FOUND = frozenset({"404", "NoSuchKey", "NotFound"})
_DENIED = frozenset({"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"})
# Answers worth asking again (botocore's standard retry mode retries these too).
RETRIED_STATUS = frozenset({429, 500, 502, 503, 504})


class RangeNotSatisfiable(StoreRejected):
    """416: the range starts at or past the object's end (any range of an empty object)."""


def marked_deleted(headers: Mapping[str, str], key: str) -> MarkedDeleted | None:
    """A 404 that says the key's current version is a delete marker (x-amz-delete-marker),
    with the marker's version id where the origin gave it; `headers` by lower-case name."""
    if headers.get("x-amz-delete-marker", "").lower() != "true":
        return None
    return MarkedDeleted(f"{key}: its current version is a delete marker",
                         headers.get("x-amz-version-id") or None)  # fmt: skip


def error_of(
    bucket: str,
    where: str,
    key: str,
    status: int,
    code: str,
    headers: Mapping[str, str],
    version_id: str | None = None,
) -> StoreError:
    """The typed error of an answer `status` with error `code` to a request for `key` (at
    `where`, its origin's name for it); of a version's (`version_id`), in the version's terms.
    Messages carry no secrets."""
    if code == "NoSuchBucket":
        # The mount points at a bucket that is not there: a misconfiguration, not a miss.
        return StoreMissing(f"origin bucket {bucket!r} does not exist")
    if version_id is not None:
        if status == 404 or code in ("NoSuchVersion", "NoSuchKey"):
            return NoSuchVersion(f"{key}: no version {version_id}")
        if status == 405 or code == "MethodNotAllowed":
            return IsDeleteMarker(f"{key}: version {version_id} is a delete marker")
        if status == 400:
            return InvalidVersionId(f"{key}: invalid version id {version_id!r}")
    if code in NOT_FOUND:
        return marked_deleted(headers, key) or ObjectNotFound(key)
    if code in _DENIED or status == 403:
        return StoreAccessDenied(f"{where}: {code}")
    if code == "PreconditionFailed" or status == 412:
        return VersionChanged(f"{where}: ETag no longer matches")
    if status == 416:
        return RangeNotSatisfiable(f"{where}: the range is past the object's end")
    if status >= 500 or status in (301, 307, 429) or code == "SlowDown":
        return StoreUnavailable(f"{where}: origin answered {status} {code}")
    if code == "KeyTooLongError":
        # Shown to the client: the limit, not the origin's address.
        return KeyTooLong("with the mount's prefix it is over the origin's 1024 bytes")
    if code == "MetadataTooLarge":
        return MetadataTooLarge("the origin keeps at most 2 KB of user metadata")
    if 400 <= status < 500:
        return StoreRejected(f"{where}: origin answered {status} {code}")
    return StoreError(f"{where}: origin answered {status} {code}")


def unreachable(where: str, exc: BaseException, endpoint: str = "") -> StoreUnavailable:
    """A transport failure; the log names the endpoint (`endpoint`, or as `exc` says it)."""
    at = f" at {endpoint}" if endpoint else ""
    return StoreUnavailable(f"{where}: origin unreachable{at}: {type(exc).__name__}: {exc}")
