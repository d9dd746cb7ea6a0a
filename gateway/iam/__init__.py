"""Policies in AWS's IAM JSON grammar: parsing (strict), compiling and evaluating them.

Pure: no I/O and nothing of the gateway. The service compiles each user's policies and each
bucket's policy once per refresh (`compile_policy`) and asks `decide` on every request.
"""

from .builtin import BUILTIN, DEFAULT_USER_POLICY, builtin_document, may_operate
from .evaluate import Decision, RequestContext, decide_statements, is_allowed
from .grammar import (
    ANONYMOUS,
    CompiledPolicy,
    MalformedPolicy,
    Statement,
    compile_policy,
    user_arn,
)
from .wildcard import wildcard

__all__ = [
    "ANONYMOUS",
    "BUILTIN",
    "DEFAULT_USER_POLICY",
    "CompiledPolicy",
    "Decision",
    "MalformedPolicy",
    "RequestContext",
    "Statement",
    "builtin_document",
    "compile_policy",
    "decide_statements",
    "is_allowed",
    "may_operate",
    "user_arn",
    "wildcard",
]
