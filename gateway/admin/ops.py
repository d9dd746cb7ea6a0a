"""The one door for administration: every change of mounts, users, keys, policies and jobs an
operator makes, through the CLI, the console or the jobs API, is checked and written here, so
that a rule (a user's name, a policy's grammar, a mount that would expose the node's own
files) holds the same whichever door it came through.

Each door renders what is refused in its own way (the CLI's exit codes, the console's
messages, the API's status codes); the refusals are the typed errors of `gateway.meta`
(`UserExists`, `NoSuchUser`, `InUse`, ...), `MalformedPolicy`, and the few of this module.
A change that every request depends on (not a job) tells the node's workers once it is
committed, before the door acknowledges it: the MetaStore's `on_change` hook, which the node
points at its state counter and the CLI at `tell_node` (gateway/generations.py).

The S3 API's own bucket operations (CreateBucket, DeleteBucket, Put/DeleteBucketPolicy,
PutBucketCors) are not administration: the service answers them, with S3's error codes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterable, Mapping
from os import PathLike
from typing import Any

from gateway.config import Settings
from gateway.iam import BUILTIN, DEFAULT_USER_POLICY, compile_policy
from gateway.jobs import JobSpec, JobStore, JobView
from gateway.meta import (
    USER_NAME,
    AccessKey,
    AccessKeyExists,
    MetaStore,
    Mount,
    MountExists,
    NoSuchPolicy,
)

POLICY_NAME = re.compile(r"[A-Za-z0-9_+=,.@-]{1,128}")
MAX_JOB_ID = (1 << 63) - 1  # a job id in the database (BIGINT): past it, no such job
# Seconds the check of a new mount waits for its store to answer (a store retries a refused
# connection or a server error a few times within this).
MOUNT_CHECK_TIMEOUT = 30.0


class AdminError(Exception):
    """A change refused, with what to tell the operator."""


class Invalid(AdminError):
    """A malformed argument; `param` names it as the CLI does (its usage error, exit 2)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Refused(AdminError):
    """A well-formed change the gateway will not make (a built-in policy's name)."""


class Unreachable(AdminError):
    """A new mount whose store did not answer its check as a node will ask it."""


class NotMounted(AdminError):
    """No mount serves the bucket."""

    def __init__(self, bucket: str) -> None:
        super().__init__(f"bucket {bucket!r} is not mounted")


# -- checks that need no database (the CLI makes them before it opens one)


def check_bucket_name(name: str) -> None:
    from gateway.service import bucket_name_problem

    problem = bucket_name_problem(name)
    if problem:
        raise Invalid(f"{name!r}: {problem}", "BUCKET")


def check_user_name(name: str) -> None:
    if not USER_NAME.fullmatch(name):
        raise Invalid(f"{name!r}: 1-64 of letters, digits, _+=,.@-", "NAME")


def check_policy_name(name: str) -> None:
    if not POLICY_NAME.fullmatch(name):
        raise Invalid(f"{name!r}: 1-128 of letters, digits, _+=,.@-", "NAME")
    if name in BUILTIN:
        raise Refused(f"{name!r} is a built-in policy")


def check_policy_document(text: str) -> None:
    """MalformedPolicy, saying why, for a document that is not a policy in IAM's grammar."""
    compile_policy(text)


async def check_mount(uri: str, options: Mapping[str, str], settings: Settings) -> None:
    """The store checks its own options and URI; the gateway checks the rest, and that the
    mount leaves the node's own files out (each node checks again when it loads the mount)."""
    from gateway.service import own_paths, store_options
    from gateway.stores import open_store

    try:
        float(options.get("metadata_ttl", "0"))
        store = open_store(uri, store_options(options))
        await store.close()
    except ValueError as exc:
        raise Invalid(str(exc), "URI or --option") from None
    try:
        own_paths(settings).check(store)
    except ValueError as exc:
        raise Invalid(f"{uri}: {exc}", "URI") from None


async def reach_mount(bucket: str, uri: str, options: Mapping[str, str]) -> None:
    """List one key of the new mount, as a node will: the store is reachable, takes the
    credentials, and its bucket, container or folder exists. What is wrong is said with its
    class (not found, connection refused, credentials refused) and the store's own words."""
    from gateway.service import cause, store_options
    from gateway.stores import StoreError, open_store

    hint = "\n  (--no-check mounts it unchecked, e.g. a store that is not up yet)"
    store = open_store(uri, store_options(options))
    try:
        async with asyncio.timeout(MOUNT_CHECK_TIMEOUT):
            await store.list_page(max_keys=1)
    except StoreError as exc:
        raise Unreachable(f"not mounted: {bucket} -> {uri}: {cause(exc)}: {exc}{hint}") from None
    except TimeoutError:
        raise Unreachable(
            f"not mounted: {bucket} -> {uri}: no answer within {MOUNT_CHECK_TIMEOUT:g} s{hint}"
        ) from None
    finally:
        await store.close()


def tell_node(cache_dir: str | PathLike[str]) -> None:
    """Tell the workers of a node over this cache dir that mounts, tenants or keys changed,
    so that the change holds on all of them when the command returns (other nodes: at their
    next refresh, refresh_interval). No node there: nothing to tell."""
    from gateway.generations import Generations

    node = Generations.existing(str(cache_dir))
    if node is not None:
        node.bump_state()
        node.close()


class Administration:
    """The changes an operator makes, over the database. `changed`, when given, becomes the
    database's `on_change` (what tells the node's workers); `submitted` wakes this node's
    job loop after a job is submitted."""

    def __init__(
        self,
        meta: MetaStore,
        changed: Callable[[], None] | None = None,
        submitted: Callable[[], None] = lambda: None,
    ) -> None:
        self._meta = meta
        if changed is not None:
            meta.on_change = changed
        self._jobs = JobStore(meta.engine)
        self._submitted = submitted

    # -- mounts

    async def add_mount(
        self, bucket: str, uri: str, options: Mapping[str, str], settings: Settings,
        check: bool = True,
    ) -> Mount:  # fmt: skip
        """Mount URI as BUCKET, checked as a node will load it and, with `check`, as a node
        will reach it. MountExists for a bucket mounted already."""
        check_bucket_name(bucket)
        await check_mount(uri, options, settings)
        if check:
            await reach_mount(bucket, uri, options)
        try:
            return await self._meta.add_mount(bucket, uri, options)
        except MountExists:
            raise MountExists(f"bucket {bucket!r} is already mounted") from None

    async def mount_demo(self, bucket: str, uri: str) -> bool:
        """Mount the node's own folder of sample files (`serve --demo`), which lies in the data
        dir and so passes no check of a mount; False when the bucket is mounted already."""
        if await self._meta.get_mount(bucket) is not None:
            return False
        await self._meta.add_mount(bucket, uri, {})
        return True

    async def set_mount_options(
        self, bucket: str, changes: Mapping[str, str], unset: Iterable[str], settings: Settings
    ) -> Mount:
        """Change options of a mount in place (its cache, versions and uploads stay); the
        options that result are checked as `add_mount` checks them. NotMounted."""
        mount = await self._meta.get_mount(bucket)
        if mount is None:
            raise NotMounted(bucket)
        unset = tuple(unset)
        options = {**mount.options, **changes}
        for name in unset:
            options.pop(name, None)
        await check_mount(mount.uri, options, settings)
        for name, value in [*((n, None) for n in unset), *changes.items()]:
            if not await self._meta.set_mount_option(bucket, name, value):
                raise NotMounted(bucket)
        changed = await self._meta.get_mount(bucket)
        if changed is None:
            raise NotMounted(bucket)
        return changed

    # -- the S3 API's own bucket operations (CreateBucket, DeleteBucket, bucket policies and
    # CORS: gateway/service checks them and answers with S3's codes; their writes are here)

    async def mount_owned_bucket(
        self, bucket: str, uri: str, options: Mapping[str, str], owner: str | None
    ) -> Mount:
        """Mount a bucket CreateBucket made in the bucket store, owned by `owner`.
        MountExists, NoSuchUser."""
        return await self._meta.add_mount(bucket, uri, options, owner=owner)

    async def unmount_bucket(self, bucket: str) -> bool:
        """DeleteBucket's mount removed; False when it was not mounted."""
        return await self._meta.remove_mount(bucket)

    async def set_bucket_policy(self, bucket: str, text: str | None) -> bool:
        """A bucket's policy put (None: deleted); False when the bucket is not mounted."""
        return await self._meta.set_bucket_policy(bucket, text)

    async def set_bucket_option(self, bucket: str, name: str, value: str | None) -> bool:
        """One option of a bucket's mount (its CORS rules); False when it is not mounted."""
        return await self._meta.set_mount_option(bucket, name, value)

    async def remove_mount(self, bucket: str) -> None:
        """Remove the mount (the under-store is not touched). NotMounted."""
        if not await self._meta.remove_mount(bucket):
            raise NotMounted(bucket)

    # -- access keys

    async def create_key(
        self, access_key: str | None = None, secret_key: str | None = None,
        description: str = "", admin: bool = False, user: str | None = None,
    ) -> AccessKey:  # fmt: skip
        """A key of `user` (None: the admin user); what is not given is generated.
        AccessKeyExists, NoSuchUser."""
        return await self._meta.create_key(access_key, secret_key, description, admin, user)

    async def delete_key(self, access_key: str) -> bool:
        """False when there is no such key."""
        return await self._meta.delete_key(access_key)

    async def set_key_disabled(self, access_key: str, disabled: bool) -> bool:
        """Disable (or enable again) a key everywhere it signs; False when there is none."""
        return await self._meta.set_key_disabled(access_key, disabled)

    async def ensure_key(self, access_key: str, secret_key: str, description: str) -> None:
        """An admin key with this secret, as the node's settings name it (`--admin-access-key`):
        made, or made anew when the stored one differs. Nodes of a fleet started at once on a
        fresh database all find it missing: the one whose create comes second finds the key
        the first made, and it is the one configured, so that node starts."""
        found = await self._meta.get_key(access_key)
        if found is not None and (found.secret_key != secret_key or not found.admin):
            await self._meta.delete_key(access_key)
            found = None
        if found is None:
            try:
                await self._meta.create_key(access_key, secret_key, description, admin=True)
            except AccessKeyExists:
                made = await self._meta.get_key(access_key)
                if made is None or made.secret_key != secret_key or not made.admin:
                    raise

    async def first_key(self) -> AccessKey | None:
        """An admin key for a node that has none (its first start), or None when it has."""
        if await self._meta.list_keys():
            return None
        return await self._meta.create_key(description="created at first start", admin=True)

    # -- users and policies (docs/tenants.md)

    async def create_user(self, name: str, policies: Iterable[str] = ()) -> tuple[str, ...]:
        """Create a user holding `policies` (none given: the default one); the policies it
        holds. Invalid, NoSuchPolicy, UserExists."""
        check_user_name(name)
        wanted = tuple(policies) or (DEFAULT_USER_POLICY,)
        for policy in wanted:
            await self.known_policy(policy)
        await self._meta.create_user(name, wanted)
        return wanted

    async def delete_user(self, name: str) -> None:
        """Delete a user and its keys. NoSuchUser, InUse (it owns buckets, or is the admin)."""
        await self._meta.delete_user(name)

    async def known_policy(self, name: str) -> None:
        """NoSuchPolicy unless `name` is a built-in policy or a stored one."""
        if name not in BUILTIN and name not in await self._meta.custom_policies():
            raise NoSuchPolicy(f"no policy {name!r}")

    async def create_policy(self, name: str, document: str) -> None:
        """Invalid, Refused, MalformedPolicy, PolicyExists."""
        check_policy_name(name)
        check_policy_document(document)
        await self._meta.create_policy(name, document)

    async def delete_policy(self, name: str) -> None:
        """NoSuchPolicy, InUse (a user holds it)."""
        await self._meta.delete_policy(name)

    async def attach_policy(self, user: str, policy: str) -> bool:
        """False when the user holds it already. NoSuchPolicy, NoSuchUser."""
        await self.known_policy(policy)
        return await self._meta.attach_policy(user, policy)

    async def detach_policy(self, user: str, policy: str) -> bool:
        """False when the user does not hold it. NoSuchUser."""
        return await self._meta.detach_policy(user, policy)

    # -- jobs (docs/jobs.md)

    async def submit_job(self, spec: JobSpec | dict[str, Any], submitted_by: str) -> int:
        """Submit a job (its spec, or its options as JSON: the API's body, the console's
        form) on behalf of `submitted_by`, and wake this node's job loop; its id. ValueError
        (UnknownBucket: no mount serves the bucket) for options that make no job."""
        if not isinstance(spec, JobSpec):
            spec = JobSpec.from_json(spec)
        job_id = await self._jobs.submit(spec, submitted_by)
        self._submitted()
        return job_id

    async def cancel_job(self, job_id: int) -> JobView | None:
        """Cancel a job that has not ended (what it loaded stays cached); the job as it is
        then, or None when there is no such job."""
        if not 0 <= job_id <= MAX_JOB_ID:
            return None
        return await self._jobs.cancel(job_id)
