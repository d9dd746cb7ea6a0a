"""What the S3 front end hands the service besides bucket and key: a listing's query, the
source of a copy, and the entries of DeleteObjects with what became of each."""

from __future__ import annotations

from dataclasses import dataclass

from gateway import errors
from gateway.service.conditions import Conditions
from gateway.stores import VersionDeleted


@dataclass(frozen=True, slots=True)
class ListQuery:
    """ListObjects(V2): `token` continues a listing, `start_after` starts one."""

    prefix: str = ""
    delimiter: str | None = None
    token: str | None = None
    start_after: str | None = None
    max_keys: int = 1000


@dataclass(frozen=True, slots=True)
class UploadsQuery:
    """ListMultipartUploads: uploads after (key_marker, upload_id_marker), in that order."""

    prefix: str = ""
    delimiter: str | None = None
    key_marker: str = ""
    upload_id_marker: str = ""
    max_uploads: int = 1000


@dataclass(frozen=True, slots=True)
class CopySource:
    """The object a copy reads, with the conditions it must meet (x-amz-copy-source-if-*),
    and for UploadPartCopy the bytes [start, end) to copy, None for all."""

    bucket: str
    key: str
    conditions: Conditions
    range: tuple[int, int] | None = None
    version_id: str | None = None  # a version named by id (?versionId=): None, the current one


@dataclass(frozen=True, slots=True)
class DeleteEntry:
    """One object of a DeleteObjects request: its key, and the version it names by id (None:
    the key's current one, as DeleteObject without versionId)."""

    key: str
    version_id: str | None = None


@dataclass(frozen=True, slots=True)
class Deletion:
    """What DeleteObjects did for one entry: `done`, what a store that keeps versions did (the
    version removed, or the delete marker made; None where it keeps one version), or the
    entry's own error."""

    entry: DeleteEntry
    done: VersionDeleted | None = None
    error: errors.S3Error | None = None
