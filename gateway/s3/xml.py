"""The XML documents S3 answers with, built as strings (cheap, and exact about S3's shapes)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote
from xml.sax.saxutils import escape

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
HEAD = '<?xml version="1.0" encoding="UTF-8"?>\n'
OWNER_ID = "75aa57f09aa0c8caeab4f8c24e99d10f8e7faeebf76c078efc7c6caea54ba06a"
OWNER_NAME = "gateway"


def iso8601(dt: datetime) -> str:
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def _owner() -> str:
    return f"<Owner><ID>{OWNER_ID}</ID><DisplayName>{OWNER_NAME}</DisplayName></Owner>"


@dataclass(frozen=True, slots=True)
class ListedObject:
    key: str
    last_modified: datetime
    etag: str
    size: int
    storage_class: str = "STANDARD"


@dataclass(frozen=True, slots=True)
class Listing:
    """One page of ListObjects (v1 or v2) in S3 terms, ready to render."""

    bucket: str
    prefix: str
    delimiter: str | None
    max_keys: int
    encode: bool  # encoding-type=url
    objects: Sequence[ListedObject]
    prefixes: Sequence[str]
    truncated: bool


def _enc(value: str, encode: bool) -> str:
    return escape(quote(value, safe="/") if encode else value)


def _common(listing: Listing) -> Iterable[str]:
    e = listing.encode
    yield f"<Name>{escape(listing.bucket)}</Name><Prefix>{_enc(listing.prefix, e)}</Prefix>"
    if listing.delimiter is not None:
        yield f"<Delimiter>{_enc(listing.delimiter, e)}</Delimiter>"
    yield f"<MaxKeys>{listing.max_keys}</MaxKeys>"
    if e:
        yield "<EncodingType>url</EncodingType>"
    yield f"<IsTruncated>{'true' if listing.truncated else 'false'}</IsTruncated>"


def _entries(listing: Listing, owner: bool) -> Iterable[str]:
    e = listing.encode
    own = _owner() if owner else ""
    for o in listing.objects:
        yield (
            f"<Contents><Key>{_enc(o.key, e)}</Key>"
            f"<LastModified>{iso8601(o.last_modified)}</LastModified>"
            f"<ETag>{escape(o.etag)}</ETag><Size>{o.size}</Size>{own}"
            f"<StorageClass>{o.storage_class}</StorageClass></Contents>"
        )
    for p in listing.prefixes:
        yield f"<CommonPrefixes><Prefix>{_enc(p, e)}</Prefix></CommonPrefixes>"


def list_v2(
    listing: Listing,
    token: str | None,
    next_token: str | None,
    start_after: str | None,
    fetch_owner: bool,
) -> bytes:
    parts = [HEAD, f'<ListBucketResult xmlns="{NS}">', *_common(listing)]
    parts.append(f"<KeyCount>{len(listing.objects) + len(listing.prefixes)}</KeyCount>")
    if token is not None:
        parts.append(f"<ContinuationToken>{escape(token)}</ContinuationToken>")
    if next_token is not None:
        parts.append(f"<NextContinuationToken>{escape(next_token)}</NextContinuationToken>")
    if start_after is not None:
        parts.append(f"<StartAfter>{_enc(start_after, listing.encode)}</StartAfter>")
    parts.extend(_entries(listing, fetch_owner))
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


def list_v1(listing: Listing, marker: str, next_marker: str | None) -> bytes:
    parts = [HEAD, f'<ListBucketResult xmlns="{NS}">', *_common(listing)]
    parts.append(f"<Marker>{_enc(marker, listing.encode)}</Marker>")
    if next_marker is not None:
        parts.append(f"<NextMarker>{_enc(next_marker, listing.encode)}</NextMarker>")
    parts.extend(_entries(listing, True))
    parts.append("</ListBucketResult>")
    return "".join(parts).encode()


@dataclass(frozen=True, slots=True)
class ListedVersion:
    """One entry of ListObjectVersions: a version, or a delete marker (no ETag nor size)."""

    key: str
    version_id: str
    latest: bool
    last_modified: datetime
    etag: str = ""
    size: int = 0
    storage_class: str = "STANDARD"
    delete_marker: bool = False


def list_versions(
    listing: Listing,
    versions: Sequence[ListedVersion],
    key_marker: str,
    version_marker: str | None,
    next_key: str | None,
    next_version: str | None,
) -> bytes:
    """ListObjectVersions: `versions` in order (listing.objects is not used)."""
    e = listing.encode
    parts = [HEAD, f'<ListVersionsResult xmlns="{NS}">', *_common(listing)]
    parts.append(f"<KeyMarker>{_enc(key_marker, e)}</KeyMarker>")
    if version_marker is not None:
        parts.append(f"<VersionIdMarker>{escape(version_marker)}</VersionIdMarker>")
    if next_key is not None:
        parts.append(f"<NextKeyMarker>{_enc(next_key, e)}</NextKeyMarker>")
    if next_version is not None:
        parts.append(f"<NextVersionIdMarker>{escape(next_version)}</NextVersionIdMarker>")
    own = _owner()
    for v in versions:
        head = (
            f"<Key>{_enc(v.key, e)}</Key><VersionId>{escape(v.version_id)}</VersionId>"
            f"<IsLatest>{'true' if v.latest else 'false'}</IsLatest>"
            f"<LastModified>{iso8601(v.last_modified)}</LastModified>"
        )
        if v.delete_marker:
            parts.append(f"<DeleteMarker>{head}{own}</DeleteMarker>")
            continue
        parts.append(
            f"<Version>{head}<ETag>{escape(v.etag)}</ETag><Size>{v.size}</Size>{own}"
            f"<StorageClass>{v.storage_class}</StorageClass></Version>"
        )
    for p in listing.prefixes:
        parts.append(f"<CommonPrefixes><Prefix>{_enc(p, e)}</Prefix></CommonPrefixes>")
    parts.append("</ListVersionsResult>")
    return "".join(parts).encode()


def list_buckets(
    buckets: Iterable[tuple[str, datetime]],
    region: str,
    next_token: str | None = None,
    prefix: str | None = None,
) -> bytes:
    items = "".join(
        f"<Bucket><Name>{escape(name)}</Name><CreationDate>{iso8601(created)}</CreationDate>"
        f"<BucketRegion>{region}</BucketRegion></Bucket>"
        for name, created in buckets
    )
    tail = (
        "" if next_token is None else f"<ContinuationToken>{escape(next_token)}</ContinuationToken>"
    )
    if prefix is not None:
        tail += f"<Prefix>{escape(prefix)}</Prefix>"
    return (
        f'{HEAD}<ListAllMyBucketsResult xmlns="{NS}">{_owner()}'
        f"<Buckets>{items}</Buckets>{tail}</ListAllMyBucketsResult>"
    ).encode()


def versioning(status: str | None) -> bytes:
    """GetBucketVersioning: no Status at all for a bucket versioning was never enabled on."""
    if status is None:
        return f'{HEAD}<VersioningConfiguration xmlns="{NS}"/>'.encode()
    return (
        f'{HEAD}<VersioningConfiguration xmlns="{NS}">'
        f"<Status>{escape(status)}</Status></VersioningConfiguration>"
    ).encode()


def object_attributes(
    etag: str | None,
    checksums: dict[str, str] | None,
    parts_count: int | None,
    storage_class: str | None,
    size: int | None,
) -> bytes:
    """GetObjectAttributes: each element only when asked for (None: not asked, or unknown)."""
    parts = [HEAD, f'<GetObjectAttributesResponse xmlns="{NS}">']
    if etag is not None:
        parts.append(f"<ETag>{escape(etag)}</ETag>")
    if checksums:
        inner = "".join(f"<Checksum{n}>{escape(v)}</Checksum{n}>" for n, v in checksums.items())
        parts.append(f"<Checksum>{inner}</Checksum>")
    if parts_count is not None:
        parts.append(f"<ObjectParts><PartsCount>{parts_count}</PartsCount></ObjectParts>")
    if storage_class is not None:
        parts.append(f"<StorageClass>{escape(storage_class)}</StorageClass>")
    if size is not None:
        parts.append(f"<ObjectSize>{size}</ObjectSize>")
    parts.append("</GetObjectAttributesResponse>")
    return "".join(parts).encode()


def location(region: str) -> bytes:
    # us-east-1 is S3's empty LocationConstraint.
    value = "" if region == "us-east-1" else escape(region)
    return f'{HEAD}<LocationConstraint xmlns="{NS}">{value}</LocationConstraint>'.encode()


def copy_result(etag: str, last_modified: datetime, part: bool = False) -> bytes:
    tag = "CopyPartResult" if part else "CopyObjectResult"
    return (
        f'{HEAD}<{tag} xmlns="{NS}"><LastModified>{iso8601(last_modified)}</LastModified>'
        f"<ETag>{escape(etag)}</ETag></{tag}>"
    ).encode()


def post_response(location: str, bucket: str, key: str, etag: str) -> bytes:
    """PostResponse: what POST Object answers with success_action_status 201."""
    return (
        f"{HEAD}<PostResponse><Location>{escape(location)}</Location>"
        f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
        f"<ETag>{escape(etag)}</ETag></PostResponse>"
    ).encode()


@dataclass(frozen=True, slots=True)
class DeletedObject:
    """One <Deleted> of DeleteObjects: the key, the version id the request named, and the
    delete marker the delete made or removed (with its version id)."""

    key: str
    version_id: str | None = None
    delete_marker: bool = False
    marker_version_id: str | None = None


@dataclass(frozen=True, slots=True)
class FailedObject:
    """One <Error> of DeleteObjects."""

    key: str
    version_id: str | None
    code: str
    message: str


def delete_result(
    deleted: Iterable[DeletedObject], failed: Iterable[FailedObject], encode: bool
) -> bytes:
    """DeleteResult: the objects deleted (omitted in Quiet mode) and the errors."""
    parts = [HEAD, f'<DeleteResult xmlns="{NS}">']
    for d in deleted:
        parts.append(f"<Deleted><Key>{_enc(d.key, encode)}</Key>")
        if d.version_id is not None:
            parts.append(f"<VersionId>{escape(d.version_id)}</VersionId>")
        if d.delete_marker:
            parts.append("<DeleteMarker>true</DeleteMarker>")
            if d.marker_version_id is not None:
                parts.append(
                    f"<DeleteMarkerVersionId>{escape(d.marker_version_id)}</DeleteMarkerVersionId>"
                )
        parts.append("</Deleted>")
    for f in failed:
        version = "" if f.version_id is None else f"<VersionId>{escape(f.version_id)}</VersionId>"
        parts.append(
            f"<Error><Key>{_enc(f.key, encode)}</Key>{version}<Code>{f.code}</Code>"
            f"<Message>{escape(f.message)}</Message></Error>"
        )
    parts.append("</DeleteResult>")
    return "".join(parts).encode()


def initiate_multipart(bucket: str, key: str, upload_id: str) -> bytes:
    return (
        f'{HEAD}<InitiateMultipartUploadResult xmlns="{NS}"><Bucket>{escape(bucket)}</Bucket>'
        f"<Key>{escape(key)}</Key><UploadId>{escape(upload_id)}</UploadId>"
        "</InitiateMultipartUploadResult>"
    ).encode()


def complete_multipart(location: str, bucket: str, key: str, etag: str) -> bytes:
    return (
        f'{HEAD}<CompleteMultipartUploadResult xmlns="{NS}">'
        f"<Location>{escape(location)}</Location><Bucket>{escape(bucket)}</Bucket>"
        f"<Key>{escape(key)}</Key><ETag>{escape(etag)}</ETag>"
        "</CompleteMultipartUploadResult>"
    ).encode()


@dataclass(frozen=True, slots=True)
class ListedPart:
    number: int
    last_modified: datetime
    etag: str
    size: int


def list_parts(
    bucket: str,
    key: str,
    upload_id: str,
    marker: int,
    max_parts: int,
    parts: Sequence[ListedPart],
    truncated: bool,
    initiated: datetime,
) -> bytes:
    items = "".join(
        f"<Part><PartNumber>{p.number}</PartNumber>"
        f"<LastModified>{iso8601(p.last_modified)}</LastModified>"
        f"<ETag>{escape(p.etag)}</ETag><Size>{p.size}</Size></Part>"
        for p in parts
    )
    nxt = f"<NextPartNumberMarker>{parts[-1].number}</NextPartNumberMarker>" if parts else ""
    return (
        f'{HEAD}<ListPartsResult xmlns="{NS}"><Bucket>{escape(bucket)}</Bucket>'
        f"<Key>{escape(key)}</Key><UploadId>{escape(upload_id)}</UploadId>"
        f"<Initiator><ID>{OWNER_ID}</ID><DisplayName>{OWNER_NAME}</DisplayName></Initiator>"
        f"{_owner()}<StorageClass>STANDARD</StorageClass>"
        f"<PartNumberMarker>{marker}</PartNumberMarker>{nxt}<MaxParts>{max_parts}</MaxParts>"
        f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{items}"
        f"<Initiated>{iso8601(initiated)}</Initiated></ListPartsResult>"
    ).encode()


@dataclass(frozen=True, slots=True)
class ListedUpload:
    key: str
    upload_id: str
    initiated: datetime


def list_uploads(
    bucket: str,
    prefix: str,
    delimiter: str | None,
    key_marker: str,
    upload_id_marker: str,
    max_uploads: int,
    uploads: Sequence[ListedUpload],
    prefixes: Sequence[str],
    truncated: bool,
    encode: bool,
) -> bytes:
    parts = [HEAD, f'<ListMultipartUploadsResult xmlns="{NS}"><Bucket>{escape(bucket)}</Bucket>']
    parts.append(f"<KeyMarker>{_enc(key_marker, encode)}</KeyMarker>")
    parts.append(f"<UploadIdMarker>{escape(upload_id_marker)}</UploadIdMarker>")
    if truncated and uploads:
        parts.append(f"<NextKeyMarker>{_enc(uploads[-1].key, encode)}</NextKeyMarker>")
        parts.append(f"<NextUploadIdMarker>{escape(uploads[-1].upload_id)}</NextUploadIdMarker>")
    parts.append(f"<Prefix>{_enc(prefix, encode)}</Prefix>")
    if delimiter:
        parts.append(f"<Delimiter>{_enc(delimiter, encode)}</Delimiter>")
    if encode:
        parts.append("<EncodingType>url</EncodingType>")
    parts.append(f"<MaxUploads>{max_uploads}</MaxUploads>")
    parts.append(f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>")
    for u in uploads:
        parts.append(
            f"<Upload><Key>{_enc(u.key, encode)}</Key><UploadId>{escape(u.upload_id)}</UploadId>"
            f"<Initiator><ID>{OWNER_ID}</ID><DisplayName>{OWNER_NAME}</DisplayName></Initiator>"
            f"{_owner()}<StorageClass>STANDARD</StorageClass>"
            f"<Initiated>{iso8601(u.initiated)}</Initiated></Upload>"
        )
    parts.extend(
        f"<CommonPrefixes><Prefix>{_enc(p, encode)}</Prefix></CommonPrefixes>" for p in prefixes
    )
    parts.append("</ListMultipartUploadsResult>")
    return "".join(parts).encode()


def tagging(tags: Iterable[tuple[str, str]]) -> bytes:
    """GetObjectTagging's answer."""
    inner = "".join(f"<Tag><Key>{escape(k)}</Key><Value>{escape(v)}</Value></Tag>" for k, v in tags)
    return f'{HEAD}<Tagging xmlns="{NS}"><TagSet>{inner}</TagSet></Tagging>'.encode()


def acl() -> bytes:
    """Object Ownership "bucket owner enforced" (AWS's default): the owner has FULL_CONTROL,
    and no one else is granted anything by an ACL."""
    grantee = (
        '<Grantee xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xsi:type="CanonicalUser">'
        f"<ID>{OWNER_ID}</ID><DisplayName>{OWNER_NAME}</DisplayName></Grantee>"
    )
    return (
        f'{HEAD}<AccessControlPolicy xmlns="{NS}">{_owner()}<AccessControlList>'
        f"<Grant>{grantee}<Permission>FULL_CONTROL</Permission></Grant>"
        "</AccessControlList></AccessControlPolicy>"
    ).encode()
