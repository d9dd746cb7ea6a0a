"""The under-stores' typed errors, mapped once to the S3 errors clients see.

What a store says of its own addresses (an origin's URL, a bucket behind a mount, a folder of
this machine) stays in the log: a client of a public mount learns the class of the failure
and the request id, and the log line with that id says the rest.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Iterator

from gateway import errors
from gateway.meta import MetaUnavailable
from gateway.stores import base as store

log = logging.getLogger(__name__)


class WithheldDetail(errors.S3Error):
    """An S3 error whose client sees only the generic message of its class, while its detail
    (str of the exception, so what every log line of it shows) is logged with the request id
    when it is rendered.

    Rendering happens once, at the edge, which is the one place that knows the request id.
    """

    def __init__(self, detail: str, **fields: str) -> None:
        super().__init__(None, **fields)
        self.args = (detail,)

    def to_xml(self, request_id: str, resource: str = "") -> bytes:
        if "{mount}" in self.detail:  # the bucket is the mount: its client named it
            self.detail = self.detail.replace("{mount}", resource.lstrip("/").partition("/")[0])
        level = logging.ERROR if self.status >= 500 else logging.WARNING
        log.log(
            level,
            "%s %s: %s",
            self.status,
            self.code,
            self.args[0],
            extra={"request_id": request_id, "resource": resource},
        )
        return super().to_xml(request_id, resource)


def _withheld(error: type[errors.S3Error], message: str) -> type[WithheldDetail]:
    """`error` (its code and status) with a generic message and the detail withheld."""
    made: type[WithheldDetail] = type(error.__name__, (WithheldDetail, error), {"message": message})
    return made


# The errors of a mount's store as a whole name the mount and the class of the cause (not
# found, connection refused, credentials refused, unreachable), never its address.
OriginUnavailable = _withheld(
    errors.ServiceUnavailable,
    "Mount {mount}: its store could not be reached or failed. Please try again.",
)
OriginRefusedConnection = _withheld(
    errors.ServiceUnavailable,
    "Mount {mount}: its store refused the connection. Please try again.",
)
OriginMissing = _withheld(
    errors.ServiceUnavailable,
    "Mount {mount}: its store's bucket, container or folder was not found.",
)
OriginDenied = _withheld(
    errors.AccessDenied, "Mount {mount}: its store refused the gateway's credentials."
)
OriginRefused = _withheld(
    errors.InvalidRequest, "The bucket's under-store refused this request as it was made."
)
OriginFailed = _withheld(
    errors.InternalError, "The bucket's under-store failed this request. Please try again."
)
MetaStoreUnavailable = _withheld(
    errors.ServiceUnavailable, "The gateway's metadata store is unavailable. Please try again."
)


def refused(exc: BaseException) -> bool:
    """Whether a store's failure is a refused connection (nothing listens at its address),
    by the OS error behind it or, where a client kept only the text, by that text."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return False
        if (
            isinstance(seen, ConnectionRefusedError)
            or getattr(seen, "errno", None) == errno.ECONNREFUSED
        ):
            return True
        text = str(seen)
        if "Connection refused" in text or "Connect call failed" in text:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def cause(exc: store.StoreError) -> str:
    """The class of a mount's failure, as an operator reads it: not found, connection
    refused, credentials refused (auth), unreachable."""
    match exc:
        case store.StoreMissing() | store.ContainerNotFound():
            return "not found"
        case store.StoreAccessDenied():
            return "credentials refused (auth)"
        case store.StoreUnavailable() if refused(exc):
            return "connection refused"
        case _:
            return "unreachable or failing"


def meta_unavailable(exc: MetaUnavailable) -> errors.S3Error:
    return MetaStoreUnavailable(f"metadata store unavailable: {exc}")


def to_s3(exc: store.StoreError, key: str) -> errors.S3Error:
    """The one table: each typed store error as the S3 error its client gets. The subclasses
    come before their bases; VersionChanged is not here: its callers read again or say why."""
    detail = f"{type(exc).__name__}: {exc}"
    match exc:
        case store.NoSuchVersion():
            return errors.NoSuchVersion(Key=key)
        case store.IsDeleteMarker():
            error = errors.MethodNotAllowed(Method="GET", ResourceType="DeleteMarker")
            error.headers["x-amz-delete-marker"] = "true"
            return error
        case store.MarkedDeleted():
            # As S3 answers a key whose current version is a delete marker.
            error = errors.NoSuchKey(Key=key)
            error.headers["x-amz-delete-marker"] = "true"
            if exc.version_id is not None:
                error.headers["x-amz-version-id"] = exc.version_id
            return error
        case store.ObjectNotFound():
            return errors.NoSuchKey(Key=key)
        case store.KeyTooLong():
            return errors.KeyTooLongError(f"Your key is too long for this bucket: {exc}.")
        case store.UnsupportedKey():
            return errors.InvalidArgument(f"The key cannot be stored here: {exc}", Key=key)
        case store.MetadataTooLarge():
            return errors.MetadataTooLarge(
                f"The object's metadata is more than this bucket keeps: {exc}."
            )
        case store.IncompleteBody():
            return errors.IncompleteBody()
        case store.WriteConflict():
            return errors.ConditionalRequestConflict(Key=key)
        case store.PreconditionFailed():
            return errors.PreconditionFailed(Condition="If-Match or If-None-Match")
        case store.UploadNotFound():
            return errors.NoSuchUpload(Key=key)
        case store.InvalidPart():
            return errors.InvalidPart()
        case store.ContainerNotEmpty():
            return errors.BucketNotEmpty()
        case store.ContainerExists():
            return errors.BucketAlreadyExists()
        case store.InvalidVersionId():
            return errors.InvalidArgument("Invalid version id specified", ArgumentName="versionId")
        case store.StoreRejected():
            return OriginRefused(detail)
        case store.StoreAccessDenied():
            return OriginDenied(detail)
        case store.StoreMissing() | store.ContainerNotFound():
            return OriginMissing(detail)
        case store.StoreUnavailable() if refused(exc):
            return OriginRefusedConnection(detail)
        case store.StoreUnavailable():
            return OriginUnavailable(detail)
        case _:
            return OriginFailed(detail)


@contextlib.contextmanager
def store_errors(key: str) -> Iterator[None]:
    try:
        yield
    except store.VersionChanged:
        raise
    except store.StoreError as exc:
        raise to_s3(exc, key) from None
