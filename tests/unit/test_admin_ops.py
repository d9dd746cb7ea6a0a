"""The one door for administration (gateway/admin/ops.py) on a real SQLite database: what it
refuses, it refuses before anything is written, with the words the CLI and the console say;
what it changes tells the node's workers (the state counter), once per change."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from gateway.admin import MAX_JOB_ID, Administration, Invalid, NotMounted, Refused, tell_node
from gateway.config import Settings, build_settings
from gateway.generations import Generations
from gateway.iam import DEFAULT_USER_POLICY, MalformedPolicy
from gateway.jobs import UnknownBucket
from gateway.meta import (
    MetaStore,
    MountExists,
    NoSuchPolicy,
    NoSuchUser,
    SecretBox,
    UserExists,
    default_database_url,
)

pytestmark = pytest.mark.anyio

POLICY = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}'  # noqa: E501


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return build_settings({"data_dir": str(tmp_path / "data")})


@pytest.fixture
def node(settings: Settings) -> Iterator[Generations]:
    """The state counter of a node over the data dir, as its workers map it."""
    settings.effective_cache_dir.mkdir(parents=True)
    counters = Generations(str(settings.effective_cache_dir))
    yield counters
    counters.close()


@pytest.fixture
async def meta(tmp_path: Path) -> AsyncIterator[MetaStore]:
    url = default_database_url(tmp_path)
    async with MetaStore(url, SecretBox([SecretBox.generate_key()])) as store:
        await store.migrate()
        yield store


@pytest.fixture
def admin(meta: MetaStore, settings: Settings, node: Generations) -> Administration:
    return Administration(meta, changed=functools.partial(tell_node, settings.effective_cache_dir))


async def _user_names(meta: MetaStore) -> list[str]:
    return [user.name for user in await meta.list_users()]


async def test_a_user_is_refused_for_a_bad_name_or_an_unknown_policy_before_anything_is_written(
    admin: Administration, meta: MetaStore, node: Generations
) -> None:
    before, state = await _user_names(meta), node.state()
    with pytest.raises(Invalid, match=r"'no spaces': 1-64 of letters") as bad:
        await admin.create_user("no spaces")
    assert bad.value.param == "NAME"
    with pytest.raises(NoSuchPolicy, match=r"^no policy 'nosuch'$"):
        await admin.create_user("ann", ["readonly", "nosuch"])
    assert await _user_names(meta) == before
    assert node.state() == state  # nothing changed: the workers are not told


async def test_a_user_gets_the_default_policy_and_is_made_once(
    admin: Administration, meta: MetaStore, node: Generations
) -> None:
    state = node.state()
    assert await admin.create_user("ann") == (DEFAULT_USER_POLICY,)
    assert node.state() == state + 1
    with pytest.raises(UserExists):
        await admin.create_user("ann", ["readonly"])
    (ann,) = [user for user in await meta.list_users() if user.name == "ann"]
    assert ann.policies == (DEFAULT_USER_POLICY,)


async def test_a_policy_is_refused_for_its_name_a_built_in_name_or_its_grammar(
    admin: Administration, meta: MetaStore
) -> None:
    with pytest.raises(Invalid, match="1-128 of letters") as bad:
        await admin.create_policy("a/b", POLICY)
    assert bad.value.param == "NAME"
    with pytest.raises(Refused, match=r"^'readonly' is a built-in policy$"):
        await admin.create_policy("readonly", POLICY)
    with pytest.raises(MalformedPolicy):
        await admin.create_policy("broken", '{"Statement": "no"}')
    assert await meta.custom_policies() == {}
    await admin.create_policy("getter", POLICY)
    assert await meta.custom_policies() == {"getter": POLICY}


async def test_attaching_needs_a_known_policy_and_a_user(
    admin: Administration, meta: MetaStore
) -> None:
    await admin.create_user("ann", ["readonly"])
    with pytest.raises(NoSuchPolicy, match=r"^no policy 'nosuch'$"):
        await admin.attach_policy("ann", "nosuch")
    with pytest.raises(NoSuchUser):
        await admin.attach_policy("bob", "readonly")
    assert await admin.attach_policy("ann", "readwrite") is True
    assert await admin.attach_policy("ann", "readwrite") is False
    assert await admin.detach_policy("ann", "nosuch") is False


async def test_a_mount_is_refused_for_its_name_its_options_or_the_node_s_own_files(
    admin: Administration, meta: MetaStore, settings: Settings, tmp_path: Path
) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    with pytest.raises(Invalid, match="'Bad_Name'") as bad:
        await admin.add_mount("Bad_Name", folder.as_uri(), {}, settings)
    assert bad.value.param == "BUCKET"
    with pytest.raises(Invalid) as bad:
        await admin.add_mount("files", folder.as_uri(), {"metadata_ttl": "soon"}, settings)
    assert bad.value.param == "URI or --option"
    with pytest.raises(Invalid, match="data dir") as bad:
        await admin.add_mount("mine", settings.data_dir.as_uri(), {}, settings)
    assert bad.value.param == "URI"
    assert await meta.list_mounts() == []

    await admin.add_mount("files", folder.as_uri(), {}, settings)
    with pytest.raises(MountExists, match=r"^bucket 'files' is already mounted$"):
        await admin.add_mount("files", folder.as_uri(), {}, settings)


async def test_a_mount_s_new_options_are_checked_as_a_new_mount_s(
    admin: Administration, meta: MetaStore, settings: Settings, tmp_path: Path, node: Generations
) -> None:
    folder = tmp_path / "files"
    folder.mkdir()
    await admin.add_mount("files", folder.as_uri(), {"metadata_ttl": "5"}, settings)
    with pytest.raises(Invalid):
        await admin.set_mount_options("files", {"metadata_ttl": "soon"}, (), settings)
    mount = await meta.get_mount("files")
    assert mount is not None and dict(mount.options) == {"metadata_ttl": "5"}

    state = node.state()
    changed = await admin.set_mount_options(
        "files", {"block_size": "1MiB"}, ["metadata_ttl"], settings
    )
    assert dict(changed.options) == {"block_size": "1MiB"}
    assert node.state() > state
    with pytest.raises(NotMounted, match=r"^bucket 'other' is not mounted$"):
        await admin.set_mount_options("other", {"metadata_ttl": "1"}, (), settings)
    with pytest.raises(NotMounted, match=r"^bucket 'other' is not mounted$"):
        await admin.remove_mount("other")


async def test_a_job_is_checked_and_wakes_the_node_s_job_loop(
    meta: MetaStore, settings: Settings, tmp_path: Path
) -> None:
    woken: list[bool] = []
    admin = Administration(meta, submitted=lambda: woken.append(True))
    with pytest.raises(UnknownBucket, match=r"^bucket 'data' is not mounted$"):
        await admin.submit_job({"bucket": "data"}, "me")
    with pytest.raises(ValueError, match="unknown job options: colour"):
        await admin.submit_job({"bucket": "data", "colour": "red"}, "me")
    assert woken == []

    (tmp_path / "files").mkdir()
    await admin.add_mount("data", (tmp_path / "files").as_uri(), {}, settings, check=False)
    job_id = await admin.submit_job({"bucket": "data", "prefix": "k/"}, "me")
    assert woken == [True]
    cancelled = await admin.cancel_job(job_id)
    assert cancelled is not None and cancelled.state == "cancelled"
    assert await admin.cancel_job(MAX_JOB_ID + 1) is None
    assert await admin.cancel_job(job_id + 1) is None
