"""The compiled form the request path decides with (gateway/service/authz.py): built from the
database's rows, with its shortcuts (the admin, the owner) giving AWS's answers."""

from __future__ import annotations

import json

from gateway.meta import TenancyRows
from gateway.service.authz import build_authorizer

ADMIN, ALICE, BOB = 1, 2, 3


def rows(bucket_policies: dict[str, str] | None = None, **policies: str) -> TenancyRows:
    return TenancyRows(
        admin_id=ADMIN,
        users={ADMIN: ("admin", ("admin",)), ALICE: ("alice", ("own",)),
               BOB: ("bob", tuple(policies) or ("own",))},
        key_users={"GKADMIN": None, "GKALICE": ALICE, "GKBOB": BOB},
        policies=policies,
        owners={"a": ALICE, "cli": None, "pub": None},
        bucket_policies=bucket_policies or {},
    )  # fmt: skip


def doc(*statements: dict[str, object]) -> str:
    return json.dumps({"Version": "2012-10-17", "Statement": list(statements)})


def test_the_admin_and_the_owner_take_the_shortcut() -> None:
    auth = build_authorizer(rows(), ["pub"])
    assert auth.quick("GKADMIN", "s3:GetObject", "a", "k") is True
    assert auth.quick("GKALICE", "s3:GetObject", "a", "k") is True
    assert auth.quick("GKBOB", "s3:GetObject", "a", "k") is False
    assert auth.quick("GKUNKNOWN", "s3:GetObject", "a", "k") is False
    assert auth.allowed("GKALICE", "s3:DeleteBucket", "a", None, "10.0.0.1")
    assert not auth.allowed("GKALICE", "s3:GetObject", "cli", "k", None)  # the admin's
    assert auth.allowed("GKADMIN", "s3:DeleteBucket", "cli", None, None)  # NULL owner: admin
    assert auth.allowed("GKBOB", "s3:CreateBucket", "new", None, None)
    assert auth.allowed("GKBOB", "s3:ListAllMyBuckets", None, None, None)


def test_public_read_is_a_policy_for_anyone() -> None:
    auth = build_authorizer(rows(), ["pub"])
    assert auth.quick(None, "s3:GetObject", "pub", "k") is True
    assert auth.allowed(None, "s3:ListBucket", "pub", None, None)
    assert not auth.allowed(None, "s3:PutObject", "pub", "k", None)
    assert auth.quick(None, "s3:GetObject", "a", "k") is False
    assert auth.allowed("GKBOB", "s3:GetObject", "pub", "k", None)  # anyone: bob too


def test_a_deny_in_a_bucket_policy_binds_the_admin_and_the_owner() -> None:
    deny = doc({"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject",
                "Resource": "arn:aws:s3:::a/keep/*"})  # fmt: skip
    auth = build_authorizer(rows({"a": deny}), [])
    for key in ("GKADMIN", "GKALICE"):
        assert not auth.allowed(key, "s3:DeleteObject", "a", "keep/x", None)
        assert auth.allowed(key, "s3:DeleteObject", "a", "tmp/x", None)
    assert auth.quick("GKADMIN", "s3:GetObject", "a", "keep/x") is True  # walked, allowed


def test_conditions_leave_the_edge_undecided() -> None:
    only_here = doc({"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*",
                     "Condition": {"IpAddress": {"aws:SourceIp": "10.0.0.0/8"}}})  # fmt: skip
    auth = build_authorizer(rows(here=only_here), [])
    assert auth.quick("GKBOB", "s3:GetObject", "a", "k") is None
    assert auth.allowed("GKBOB", "s3:GetObject", "a", "k", "10.1.1.1")
    assert not auth.allowed("GKBOB", "s3:GetObject", "a", "k", "192.168.0.1")
    assert not auth.allowed("GKBOB", "s3:GetObject", "a", "k", None)


def test_a_bucket_policy_names_users() -> None:
    grant = doc({"Effect": "Allow", "Principal": {"AWS": "arn:aws:iam:::user/bob"},
                 "Action": ["s3:GetObject", "s3:ListBucket"],
                 "Resource": ["arn:aws:s3:::a", "arn:aws:s3:::a/train/*"]})  # fmt: skip
    auth = build_authorizer(rows({"a": grant}), [])
    assert auth.quick("GKBOB", "s3:GetObject", "a", "train/1") is True
    assert auth.quick("GKBOB", "s3:GetObject", "a", "eval/1") is False
    assert auth.quick(None, "s3:GetObject", "a", "train/1") is False
    # Granted in it, but not its own: not in bob's ListBuckets, as AWS lists buckets.
    assert not auth.may_see("GKBOB", "a") and not auth.may_see("GKBOB", "cli")
    assert auth.may_see("GKALICE", "a") and not auth.may_see("GKALICE", "cli")
    assert auth.may_see("GKADMIN", "a")


def test_an_unreadable_stored_policy_fails_closed() -> None:
    auth = build_authorizer(rows(broken='{"Statement": "nonsense"}'), [])
    assert not auth.allowed("GKBOB", "s3:GetObject", "pub", "k", None)
    assert not auth.allowed("GKBOB", "s3:CreateBucket", "new", None, None)
