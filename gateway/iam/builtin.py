"""The built-in policies, by name: a new user's `own`, and `readonly`, `readwrite`, `admin`.
Their documents are in the same grammar as custom ones (`gateway policies list` shows them)."""

from __future__ import annotations

import json
from collections.abc import Iterable

_ALL = "*"
_READ_WRITE = [
    "s3:Get*", "s3:List*", "s3:PutObject*", "s3:DeleteObject*",
    "s3:AbortMultipartUpload", "s3:RestoreObject", "s3:CreateBucket",
]  # fmt: skip

BUILTIN: dict[str, dict[str, object]] = {
    # May create buckets and list its own; ownership grants the rest in the buckets it owns.
    "own": {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "CreateAndList",
                "Effect": "Allow",
                "Action": ["s3:CreateBucket", "s3:ListAllMyBuckets"],
                "Resource": _ALL,
            }
        ],
    },
    "readonly": {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "Read", "Effect": "Allow", "Action": ["s3:Get*", "s3:List*"], "Resource": _ALL}
        ],
    },
    # Reads and writes objects everywhere and creates buckets; no bucket deletes or policies
    # of buckets it does not own.
    "readwrite": {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ReadWrite",
                "Effect": "Allow",
                "Action": [
                    "s3:Get*",
                    "s3:List*",
                    "s3:PutObject*",
                    "s3:DeleteObject*",
                    "s3:AbortMultipartUpload",
                    "s3:RestoreObject",
                    "s3:CreateBucket",
                ],
                "Resource": _ALL,
            }
        ],
    },
    "admin": {
        "Version": "2012-10-17",
        "Statement": [{"Sid": "All", "Effect": "Allow", "Action": "s3:*", "Resource": _ALL}],
    },
}
DEFAULT_USER_POLICY = "own"


def builtin_document(name: str) -> str | None:
    doc = BUILTIN.get(name)
    return None if doc is None else json.dumps(doc, indent=2)


OPERATOR_POLICY = "admin"  # what a key's user must hold for the key's `admin` flag to count


def may_operate(key_admin: bool, user_policies: Iterable[str]) -> bool:
    """Whether a key may use the console and the jobs API (docs/tenants.md, "Admin keys"): it
    is marked admin AND its user holds the built-in `admin` policy, so it may do everything
    already. No key can raise its own rights: one marked admin whose user holds less gets no
    operator rights from the mark, and so cannot attach a policy to its own user."""
    return key_admin and OPERATOR_POLICY in user_policies
