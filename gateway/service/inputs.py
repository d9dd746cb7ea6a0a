"""What the S3 front end hands the service besides bucket and key: a listing's query, and the
source of a copy."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.service.conditions import Conditions


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
