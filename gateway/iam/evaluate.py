"""AWS's evaluation: an explicit Deny in any applicable statement wins; then any Allow (or
owning the bucket) allows; else the request is denied (implicitly)."""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .dates import EPOCH_TIME, request_time
from .grammar import CompiledPolicy, Statement


class Decision(enum.Enum):
    DENY = "deny"  # an explicit Deny matched
    ALLOW = "allow"
    NONE = "none"  # nothing matched: denied unless something else allows


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What a statement is checked against: the action (as routing names it, s3:GetObject),
    the resource's ARN, and the condition keys the request has (lower-case names). `clock`
    (seconds since the epoch) is read, once a decision, only when a statement names the
    request's time (aws:CurrentTime, aws:EpochTime)."""

    action: str
    resource: str
    values: Mapping[str, str] = field(default_factory=dict)
    clock: Callable[[], float] = time.time

    def timed(self) -> RequestContext:
        """This context with the request's time among its values (read from the clock now,
        unless it has it already)."""
        if EPOCH_TIME in self.values:
            return self
        return replace(self, values={**self.values, **request_time(self.clock())})


def decide_statements(statements: Iterable[Statement], ctx: RequestContext) -> Decision:
    allowed = False
    for s in statements:
        if s.timed:
            ctx = ctx.timed()
        if s.matches(ctx.action, ctx.resource, ctx.values):
            if not s.allow:
                return Decision.DENY
            allowed = True
    return Decision.ALLOW if allowed else Decision.NONE


def is_allowed(
    identity: Sequence[CompiledPolicy],
    resource_statements: Sequence[Statement],
    owner: bool,
    ctx: RequestContext,
) -> bool:
    """The whole decision for one request: the user's policies (`identity`, empty for an
    anonymous request), the bucket policy's statements that name this principal, and whether
    the principal owns the bucket (ownership grants everything on it, short of a Deny)."""
    if any(p.timed for p in identity) or any(s.timed for s in resource_statements):
        ctx = ctx.timed()  # one time for the whole decision
    allowed = owner
    for policy in identity:
        decision = decide_statements(policy.statements, ctx)
        if decision is Decision.DENY:
            return False
        allowed = allowed or decision is Decision.ALLOW
    decision = decide_statements(resource_statements, ctx)
    if decision is Decision.DENY:
        return False
    return allowed or decision is Decision.ALLOW
