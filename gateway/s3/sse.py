"""Server-side encryption as a request asks for it, checked as S3 checks it before anything
is stored: SSE-S3 and SSE-KMS (x-amz-server-side-encryption and its KMS headers) and SSE-C
(x-amz-server-side-encryption-customer-*, the client's own AES-256 key with its MD5). The
service then refuses any a mount's store cannot do (NotImplemented), never storing plaintext.

Names are WriteAttrs.encryption's (gateway.stores.base.ENCRYPTION)."""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping

from gateway import errors

SSE = "x-amz-server-side-encryption"
_KMS_ID = f"{SSE}-aws-kms-key-id"
_CONTEXT = f"{SSE}-context"
_BUCKET_KEY = f"{SSE}-bucket-key-enabled"
_C = f"{SSE}-customer-"
_COPY_C = f"x-amz-copy-source-{SSE}-customer-"
_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")


def requested(headers: Mapping[str, str]) -> dict[str, str]:
    """The encryption a write asks for (PUT, CopyObject's target, CreateMultipartUpload)."""
    out = customer_key(headers)
    algorithm = headers.get(SSE)
    if algorithm is not None:
        if algorithm not in _ALGORITHMS:
            raise errors.InvalidArgument(
                "The encryption method specified is not supported",
                ArgumentName=SSE, ArgumentValue=algorithm,
            )  # fmt: skip
        if out:
            raise errors.InvalidArgument(
                "Server Side Encryption with Customer provided key is incompatible with the"
                " encryption method specified",
                ArgumentName=SSE, ArgumentValue=algorithm,
            )  # fmt: skip
        out["algorithm"] = algorithm
    kms = {_KMS_ID: "kms_key_id", _CONTEXT: "kms_context", _BUCKET_KEY: "bucket_key"}
    for header, name in kms.items():
        value = headers.get(header)
        if value is None:
            continue
        if not out.get("algorithm", "").startswith("aws:kms") and header != _BUCKET_KEY:
            raise errors.InvalidArgument(
                "Server Side Encryption with AWS KMS managed key requires HTTP header"
                " x-amz-server-side-encryption : aws:kms",
                ArgumentName=SSE, ArgumentValue=out.get("algorithm", "null"),
            )  # fmt: skip
        out[name] = value
    return out


def customer_key(headers: Mapping[str, str], prefix: str = _C) -> dict[str, str]:
    """The SSE-C key a request carries (customer_algorithm, customer_key, customer_key_md5),
    checked; empty for none. With `prefix` _COPY_C: a copy's source key."""
    algorithm = headers.get(f"{prefix}algorithm")
    key = headers.get(f"{prefix}key")
    md5 = headers.get(f"{prefix}key-md5")
    if algorithm is None and key is None and md5 is None:
        return {}
    if algorithm is None:
        raise errors.InvalidArgument(
            "Requests specifying Server Side Encryption with Customer provided keys must provide"
            " a valid encryption algorithm.",
            ArgumentName=f"{prefix}algorithm", ArgumentValue="null",
        )  # fmt: skip
    if algorithm != "AES256":
        raise errors.InvalidEncryptionAlgorithmError(
            ArgumentName=f"{prefix}algorithm", ArgumentValue=algorithm
        )
    if key is None:
        raise errors.InvalidArgument(
            "Requests specifying Server Side Encryption with Customer provided keys must provide"
            " an appropriate secret key.",
            ArgumentName=f"{prefix}key", ArgumentValue="null",
        )  # fmt: skip
    try:
        raw = base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 32:
        raise errors.InvalidArgument(
            "The secret key was invalid for the specified algorithm.",
            ArgumentName=f"{prefix}key", ArgumentValue="null",
        )  # fmt: skip
    digest = base64.b64encode(hashlib.md5(raw).digest()).decode()
    if md5 is None:
        raise errors.InvalidArgument(
            "Requests specifying Server Side Encryption with Customer provided keys must provide"
            " the client calculated MD5 of the secret key.",
            ArgumentName=f"{prefix}key-MD5", ArgumentValue="null",
        )  # fmt: skip
    if md5 != digest:
        raise errors.InvalidArgument(
            "The calculated MD5 hash of the key did not match the hash that was provided.",
            ArgumentName=f"{prefix}key-MD5", ArgumentValue=md5,
        )  # fmt: skip
    return {"customer_algorithm": algorithm, "customer_key": key, "customer_key_md5": md5}


def copy_source_key(headers: Mapping[str, str]) -> dict[str, str]:
    return customer_key(headers, _COPY_C)


def response_headers(encryption: Mapping[str, str]) -> dict[str, str]:
    """What GET, HEAD and writes answer about an object's encryption."""
    out = {}
    if "algorithm" in encryption:
        out[SSE] = encryption["algorithm"]
        if "kms_key_id" in encryption:
            out[_KMS_ID] = encryption["kms_key_id"]
        if encryption.get("bucket_key") == "true":
            out[_BUCKET_KEY] = "true"
    if "customer_algorithm" in encryption:
        out[f"{_C}algorithm"] = encryption["customer_algorithm"]
        if "customer_key_md5" in encryption:
            out[f"{_C}key-MD5"] = encryption["customer_key_md5"]
    return out
