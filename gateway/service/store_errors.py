"""The under-stores' typed errors, mapped once to the S3 errors clients see."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from gateway import errors
from gateway.stores import base as store


@contextlib.contextmanager
def store_errors(key: str) -> Iterator[None]:
    try:
        yield
    except store.ObjectNotFound:
        raise errors.NoSuchKey(Key=key) from None
    except store.StoreAccessDenied as exc:
        raise errors.AccessDenied(f"The under-store denied access: {exc}") from None
    except store.StoreUnavailable as exc:
        raise errors.ServiceUnavailable(f"The under-store is unavailable: {exc}") from None
    except store.PreconditionFailed:
        raise errors.PreconditionFailed(Condition="If-Match or If-None-Match") from None
    except store.UploadNotFound:
        raise errors.NoSuchUpload(Key=key) from None
    except store.ContainerNotEmpty:
        raise errors.BucketNotEmpty() from None
    except store.ContainerExists:
        raise errors.BucketAlreadyExists() from None
    except store.ContainerNotFound as exc:
        raise errors.ServiceUnavailable(f"The mount's container is missing: {exc}") from None
    except store.InvalidPart:
        raise errors.InvalidPart() from None
    except store.IncompleteBody:
        raise errors.IncompleteBody() from None
    except store.UnsupportedKey as exc:
        raise errors.InvalidArgument(f"The key cannot be stored here: {exc}", Key=key) from None
