"""Operator endpoints beside the S3 API (health and the node's Prometheus metrics), and the one
door for administration (`ops.py`): the changes the CLI, the console and the jobs API make."""

from gateway.admin.ops import (
    MAX_JOB_ID,
    AdminError,
    Administration,
    Invalid,
    NotMounted,
    Refused,
    Unreachable,
    check_bucket_name,
    check_mount,
    check_policy_document,
    check_policy_name,
    check_user_name,
    reach_mount,
    tell_node,
)

__all__ = [
    "MAX_JOB_ID",
    "AdminError",
    "Administration",
    "Invalid",
    "NotMounted",
    "Refused",
    "Unreachable",
    "check_bucket_name",
    "check_mount",
    "check_policy_document",
    "check_policy_name",
    "check_user_name",
    "reach_mount",
    "tell_node",
]
