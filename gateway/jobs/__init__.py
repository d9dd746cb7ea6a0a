"""Preload jobs: warm a prefix of a bucket into the fleet's caches, each node loading the blocks
it owns, with the job's state, work items and progress in the database (docs/jobs.md)."""

from gateway.jobs.db import JobStore, UnknownBucket
from gateway.jobs.model import (
    ACTIVE,
    END_STATES,
    JobSpec,
    JobView,
    NodeProgress,
    parse_bandwidth,
)

__all__ = [
    "ACTIVE",
    "END_STATES",
    "JobSpec",
    "JobStore",
    "JobView",
    "NodeProgress",
    "UnknownBucket",
    "parse_bandwidth",
]
