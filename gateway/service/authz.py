"""Who may do what: the users' policies and the buckets' owners and policies, compiled once
per refresh of the namespace into dictionaries the request path reads with no I/O.

A request's decision is AWS's (gateway/iam/evaluate.py): an explicit Deny wins, then an Allow
in the user's policies or in the bucket policy (for this user or for everyone), or owning the
bucket, allows; nothing else does. The common cases take no policy walk at all: a user with an
unconditional allow-everything policy (the admin) or the bucket's owner, where no Deny is in
play, is allowed by two dictionary reads and a comparison.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gateway.iam import (
    ANONYMOUS,
    BUILTIN,
    CompiledPolicy,
    MalformedPolicy,
    RequestContext,
    Statement,
    builtin_document,
    compile_policy,
    is_allowed,
    wildcard,
)
from gateway.iam.actions import ACTIONS
from gateway.iam.grammar import HEADER_KEYS, S3_ARN
from gateway.meta import TenancyRows

log = logging.getLogger(__name__)

ALL_BUCKETS = S3_ARN + "*"  # the resource of ListAllMyBuckets
# Anonymous reads of a public_read=true mount, as a bucket policy would say them.
PUBLIC_READ = ("s3:GetObject", "s3:ListBucket")
_DENY_ALL = Statement(
    sid="unreadable policy",
    allow=False,
    actions=frozenset(ACTIONS),
    resources=(),
    not_resource=False,
    conditions=(),
    all_resources=True,
)


@dataclass(frozen=True, slots=True)
class Principal:
    """A user as the request path sees it, found by access key."""

    user_id: int | None
    name: str
    policies: tuple[CompiledPolicy, ...]
    allows_all: bool  # an unconditional Allow of everything, and no Deny
    has_deny: bool
    conditional: bool  # some statement has a Condition: decisions need the request's values


@dataclass(frozen=True, slots=True)
class BucketRules:
    owner: int | None
    everyone: tuple[Statement, ...]  # the bucket policy's statements for "*"
    by_user: Mapping[str, tuple[Statement, ...]]
    has_deny: bool
    conditional: bool
    document: str | None  # the bucket policy as stored (None: none)

    def statements_for(self, name: str | None) -> tuple[Statement, ...]:
        if name is None:
            return self.everyone
        mine = self.by_user.get(name)
        return self.everyone + mine if mine else self.everyone


class Caller(NamedTuple):
    """Who is asking, for the operations that decide more than once (DeleteObjects per key,
    a copy's source, ListBuckets, CreateBucket's owner): made by the front end once it has
    authenticated the request, and passed to those operations. (A tuple: made on every
    request, a frozen dataclass cost more than the decision.)"""

    access_key: str | None
    source_ip: str | None
    secure: bool | None = None  # over TLS (aws:SecureTransport); None: not known


@dataclass(frozen=True, slots=True)
class Authorizer:
    principals: Mapping[str, Principal] = field(default_factory=dict)  # by access key
    buckets: Mapping[str, BucketRules] = field(default_factory=dict)
    # Keys allowed everything everywhere: an allow-everything user's, while no policy has a
    # Deny in play. One set lookup decides the admin's requests.
    free: frozenset[str] = frozenset()

    def principal(self, access_key: str | None) -> Principal | None:
        return None if access_key is None else self.principals.get(access_key)

    def owns(self, access_key: str | None, bucket: str) -> bool:
        p = self.principal(access_key)
        rules = self.buckets.get(bucket)
        return p is not None and rules is not None and rules.owner == p.user_id

    def quick(self, access_key: str | None, action: str, bucket: str, key: str) -> bool | None:
        """The decision for a request whose conditions' values are not at hand (the edge's
        hits): True or False where no Condition can matter, else None (take the full path)."""
        if access_key in self.free:
            return True
        rules = self.buckets.get(bucket)
        if access_key is not None:
            p = self.principals.get(access_key)
            if p is None:
                return False
            if _no_deny_and_granted(p, rules):
                return True
            if p.conditional or (rules is not None and rules.conditional):
                return None
        elif rules is None or not rules.everyone:
            return False
        elif rules.conditional:
            return None
        return self.allowed(access_key, action, bucket, key, None)

    def allowed(
        self,
        access_key: str | None,
        action: str,
        bucket: str | None,
        key: str | None,
        source_ip: str | None,
        prefix: str | None = None,
        delimiter: str | None = None,
        secure: bool | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> bool:
        """`headers`: the request's, for the condition keys that are a header's value
        (s3:x-amz-server-side-encryption, s3:x-amz-acl...; iam.grammar.HEADER_KEYS)."""
        if access_key in self.free:
            return True
        rules = self.buckets.get(bucket) if bucket is not None else None
        p: Principal | None = None
        if access_key is not None:
            p = self.principals.get(access_key)
            if p is None:
                return False
            if _no_deny_and_granted(p, rules):
                return True
        elif rules is None or not rules.everyone:
            return False
        if bucket is None:
            resource = ALL_BUCKETS
        elif key is None:
            resource = S3_ARN + bucket
        else:
            resource = f"{S3_ARN}{bucket}/{key}"
        values: dict[str, str] = {}
        if source_ip is not None:
            values["aws:sourceip"] = source_ip
        if prefix is not None:
            values["s3:prefix"] = prefix
        if delimiter is not None:
            values["s3:delimiter"] = delimiter
        if secure is not None:
            values["aws:securetransport"] = "true" if secure else "false"
        if headers:
            for header, condition_key in HEADER_KEYS.items():
                value = headers.get(header)
                if value is not None:
                    values[condition_key] = value
        if p is not None:
            values["aws:username"] = p.name
            if p.user_id is not None:
                values["aws:userid"] = str(p.user_id)
        ctx = RequestContext(action, resource, values)
        identity = p.policies if p is not None else ()
        statements = rules.statements_for(p.name if p else None) if rules is not None else ()
        owner = p is not None and rules is not None and rules.owner == p.user_id
        return is_allowed(identity, statements, owner, ctx)

    def may_see(self, access_key: str | None, bucket: str) -> bool:
        """Whether ListBuckets shows the bucket to this key: its own, or one that the user's
        own policies grant something in (as AWS lists an account's buckets to its IAM users).
        A bucket policy, even one that allows everyone, grants access but never lists the
        bucket to others: AWS lists only the caller's buckets."""
        p = self.principal(access_key)
        if p is None:
            return False
        if p.allows_all:
            return True
        rules = self.buckets.get(bucket)
        if rules is not None and rules.owner == p.user_id:
            return True
        statements = [s for policy in p.policies for s in policy.statements]
        return any(s.allow and _names_bucket(s, bucket) for s in statements)


# What a statement may allow without granting anything in a bucket.
_OUTSIDE_BUCKETS = frozenset({"s3:ListAllMyBuckets", "s3:CreateBucket"})


def _names_bucket(s: Statement, bucket: str) -> bool:
    if s.actions <= _OUTSIDE_BUCKETS:
        return False
    if s.all_resources or s.not_resource:
        return True
    return any(wildcard(p.split("/", 1)[0])(bucket) for p in s.patterns)


def _policy(name: str, text: str, bucket: str | None = None) -> CompiledPolicy:
    try:
        return compile_policy(text, bucket)
    except MalformedPolicy as exc:
        # Checked when stored, so a newer grammar's document at most: fail closed.
        log.error("policy %s cannot be read, denying what it covers: %s", name, exc)
        return CompiledPolicy((_DENY_ALL,), has_deny=True)


def _public_read(bucket: str) -> tuple[Statement, ...]:
    text = (
        '{"Version": "2012-10-17", "Statement": [{"Sid": "public_read", "Effect": "Allow",'
        f' "Principal": "*", "Action": ["s3:GetObject", "s3:ListBucket"],'
        f' "Resource": ["{S3_ARN}{bucket}", "{S3_ARN}{bucket}/*"]}}]}}'
    )
    return compile_policy(text, bucket).statements


def build_authorizer(rows: TenancyRows, public_read: Iterable[str]) -> Authorizer:
    """The compiled form of what the database says (`public_read`: the buckets mounted with
    public_read=true)."""
    compiled: dict[str, CompiledPolicy] = {}
    for name in BUILTIN:
        compiled[name] = compile_policy(builtin_document(name) or "")
    for name, text in rows.policies.items():
        if name not in BUILTIN:
            compiled[name] = _policy(name, text)
    by_user: dict[int, Principal] = {}
    for user_id, (user_name, held) in rows.users.items():
        policies = tuple(compiled[p] for p in held if p in compiled)
        has_deny = any(p.has_deny for p in policies)
        by_user[user_id] = Principal(
            user_id=user_id,
            name=user_name,
            policies=policies,
            allows_all=not has_deny and any(p.allows_all for p in policies),
            has_deny=has_deny,
            conditional=any(s.conditions or s.variables for p in policies for s in p.statements),
        )
    principals: dict[str, Principal] = {}
    for access_key, key_user in rows.key_users.items():
        found = by_user.get(key_user if key_user is not None else rows.admin_id or -1)
        if found is not None:
            principals[access_key] = found
    public = set(public_read)
    user_created = {
        name: rows.user_created[uid]
        for uid, (name, _) in rows.users.items()
        if uid in rows.user_created
    }
    buckets: dict[str, BucketRules] = {}
    for bucket, owner in rows.owners.items():
        document = rows.bucket_policies.get(bucket)
        statements: tuple[Statement, ...] = ()
        if document is not None:
            statements = _policy(f"of bucket {bucket}", document, bucket).statements
        if bucket in public:
            statements += _public_read(bucket)
        everyone = tuple(s for s in statements if s.principals is None or ANONYMOUS in s.principals)
        named: dict[str, list[Statement]] = {}
        stored = rows.policy_stored.get(bucket)
        for s in statements:
            for user in s.principals or ():
                if user == ANONYMOUS:
                    continue
                # A user made after the policy was stored is not the one it names.
                created = user_created.get(user)
                if stored is not None and created is not None and created > stored:
                    continue
                named.setdefault(user, []).append(s)
        buckets[bucket] = BucketRules(
            owner=owner if owner is not None else rows.admin_id,
            everyone=everyone,
            by_user={u: tuple(ss) for u, ss in named.items()},
            has_deny=any(not s.allow for s in statements),
            conditional=any(s.conditions or s.variables for s in statements),
            document=document,
        )
    free: frozenset[str] = frozenset()
    if not any(r.has_deny for r in buckets.values()):
        free = frozenset(k for k, p in principals.items() if p.allows_all)
    return Authorizer(principals, buckets, free)


def _no_deny_and_granted(p: Principal, rules: BucketRules | None) -> bool:
    """The shortcut both decisions take: nothing can deny, and the user may do everything
    or owns the bucket."""
    return (
        not p.has_deny
        and (rules is None or not rules.has_deny)
        and (p.allows_all or (rules is not None and rules.owner == p.user_id))
    )
