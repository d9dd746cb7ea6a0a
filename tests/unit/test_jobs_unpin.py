"""An unpin job as the API, the database and the command line take and show it: its options
checked, its end told in blocks and bytes per node, its totals in the JSON for scripts."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from gateway.jobs import progress
from gateway.jobs.db import _unpinned
from gateway.jobs.model import DONE, PARTIAL, JobSpec, JobView, NodeProgress


def test_unpin_is_a_kind_of_job_that_goes_with_no_loading_option() -> None:
    spec = JobSpec("data", "train/", include=("*.tar",), unpin=True)
    assert spec.kind == "unpin"
    assert JobSpec.from_json(spec.to_json()) == spec
    for bad in (
        {"bucket": "data", "unpin": 1},
        {"bucket": "data", "unpin": True, "pin": True},
        {"bucket": "data", "unpin": True, "verify": True},
        {"bucket": "data", "unpin": True, "metadata_only": True},
        {"bucket": "data", "unpin": True, "refresh": True},
        {"bucket": "data", "unpin": True, "replicas": 2},
        {"bucket": "data", "unpin": True, "bandwidth": 1000},
    ):
        with pytest.raises(ValueError):
            JobSpec.from_json(bad)


def test_an_unpin_ends_with_the_blocks_and_bytes_it_unpinned() -> None:
    assert _unpinned(5, 7, 3 << 20, 0) == (
        DONE, "unpinned the 7 blocks (3.0 MiB) of 5 objects cached on the fleet"
    )  # fmt: skip
    state, message = _unpinned(5, 1, 100, 2)
    assert state == PARTIAL
    assert message == (
        "unpinned the 1 block (100 B) of 5 objects cached on the fleet; "
        "2 objects not unpinned on every node (see the errors)"
    )


def test_an_unpin_job_is_shown_per_node_and_totalled_in_json() -> None:
    job = JobView(
        id=12, spec=JobSpec("data", "train/", unpin=True), state=DONE,
        message="unpinned the 7 blocks (3.0 MiB) of 5 objects cached on the fleet",
        submitted_by="ops", submitted_at=datetime(2026, 12, 4, tzinfo=UTC), started_at=None,
        ended_at=None, total_objects=5, total_bytes=3 << 20, listed=True,
        nodes=(NodeProgress("node-0", objects=3, bytes=1 << 20, cached_objects=4,
                            cached_bytes=2 << 20),
               NodeProgress("node-1", objects=2, bytes=2 << 20, cached_objects=3,
                            cached_bytes=1 << 20, failures=1)),
    )  # fmt: skip
    summary = progress.summary(job).splitlines()
    assert summary[0] == f"job 12 done: {job.message}"
    assert summary[1].split() == ["NODE", "UNPINNED", "BLOCKS", "UNPINNED", "BYTES", "FAILED"]
    assert summary[2].split() == ["node-0", "4", "2.0", "MiB", "0"]
    assert summary[3].split() == ["node-1", "3", "1.0", "MiB", "1"]
    assert "job 12: unpin s3://data/train/" in progress.detail(job)
    assert "--unpin" in progress.detail(job)
    raw = job.to_json()
    assert (raw["kind"], raw["unpinned_blocks"], raw["unpinned_bytes"]) == ("unpin", 7, 3 << 20)
    assert JobView.from_json(raw) == job
    as_load = dataclasses.replace(job, spec=JobSpec("data", "train/"))
    assert "unpinned_blocks" not in as_load.to_json()
