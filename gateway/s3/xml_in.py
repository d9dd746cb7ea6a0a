"""The XML bodies clients send (DeleteObjects, CompleteMultipartUpload, CreateBucket),
parsed with defusedxml so that entity tricks cannot blow up memory, and size-capped."""

from __future__ import annotations

from xml.etree.ElementTree import Element

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from gateway import decimals, errors

MAX_XML_BODY = 2 << 20  # S3 caps DeleteObjects at 1000 keys, well under this


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def parse(data: bytes) -> Element:
    if len(data) > MAX_XML_BODY:
        raise errors.MalformedXML("The XML you provided was larger than the maximum allowed.")
    try:
        root: Element = SafeET.fromstring(data)
    except (SafeET.ParseError, DefusedXmlException, ValueError):
        raise errors.MalformedXML() from None
    return root


def _children(el: Element, name: str) -> list[Element]:
    return [c for c in el if _local(c.tag) == name]


def _text(el: Element, name: str) -> str | None:
    found = _children(el, name)
    return None if not found else (found[0].text or "")


def delete_objects(data: bytes) -> tuple[list[tuple[str, str | None]], bool]:
    """The objects of a DeleteObjects request (1..1000), each a key and the version it names
    (None: none), and its Quiet flag."""
    root = parse(data)
    if _local(root.tag) != "Delete":
        raise errors.MalformedXML()
    objects: list[tuple[str, str | None]] = []
    for obj in _children(root, "Object"):
        key = _text(obj, "Key")
        if not key:
            raise errors.MalformedXML()
        versions = _children(obj, "VersionId")
        if len(versions) > 1:
            raise errors.MalformedXML()  # which one? never the last one, silently
        objects.append((key, (versions[0].text or "") if versions else None))
    if not objects or len(objects) > 1000:
        raise errors.MalformedXML()
    quiet = (_text(root, "Quiet") or "").strip().lower() == "true"
    return objects, quiet


def complete_multipart(data: bytes) -> list[tuple[int, str]]:
    root = parse(data)
    if _local(root.tag) != "CompleteMultipartUpload":
        raise errors.MalformedXML()
    parts = []
    for part in _children(root, "Part"):
        text, etag = _text(part, "PartNumber"), _text(part, "ETag")
        # Any integer is well-formed (one never uploaded is InvalidPart); '²', '+1' or a
        # number past 2^31 - 1 is not.
        number = None if text is None else decimals.parse(text.strip(), decimals.INT32_MAX)
        if number is None or etag is None:
            raise errors.MalformedXML()
        parts.append((number, etag.strip()))
    return parts


def create_bucket(data: bytes) -> str | None:
    """The LocationConstraint of a CreateBucket body (accepted, the node has one region)."""
    if not data.strip():
        return None
    root = parse(data)
    if _local(root.tag) != "CreateBucketConfiguration":
        raise errors.MalformedXML()
    return _text(root, "LocationConstraint")


def versioning(data: bytes) -> tuple[str | None, str | None]:
    """(Status, MfaDelete) of a PutBucketVersioning body, each None where not given."""
    root = parse(data)
    if _local(root.tag) != "VersioningConfiguration":
        raise errors.MalformedXML()
    status, mfa = _text(root, "Status"), _text(root, "MfaDelete")
    if status not in (None, "Enabled", "Suspended") or mfa not in (None, "Enabled", "Disabled"):
        raise errors.MalformedXML()
    return status, mfa


def tagging(data: bytes) -> list[tuple[str, str]]:
    """The (key, value) pairs of a PutObjectTagging body, in order (checked by s3.tags)."""
    root = parse(data)
    if _local(root.tag) != "Tagging":
        raise errors.MalformedXML()
    sets = _children(root, "TagSet")
    if len(sets) != 1:
        raise errors.MalformedXML()
    pairs = []
    for tag in sets[0]:
        if _local(tag.tag) != "Tag":
            raise errors.MalformedXML()
        key, value = _text(tag, "Key"), _text(tag, "Value")
        if key is None or value is None:
            raise errors.MalformedXML()
        pairs.append((key, value))
    return pairs


def acl_grants(data: bytes) -> list[tuple[str, str | None, str | None]]:
    """The grants of a PutBucketAcl / PutObjectAcl body: (permission, grantee type, grantee
    ID) each."""
    root = parse(data)
    if _local(root.tag) != "AccessControlPolicy":
        raise errors.MalformedXML()
    grants: list[tuple[str, str | None, str | None]] = []
    for listed in _children(root, "AccessControlList"):
        for grant in _children(listed, "Grant"):
            grantee = _children(grant, "Grantee")
            kind = ident = None
            if grantee:
                kind = next(
                    (v for k, v in grantee[0].attrib.items() if k.rsplit("}", 1)[-1] == "type"),
                    None,
                )
                ident = _text(grantee[0], "ID")
            grants.append(((_text(grant, "Permission") or "").strip(), kind, ident))
    return grants
