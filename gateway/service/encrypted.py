"""GET and HEAD of objects encrypted with the client's own key (SSE-C), which the gateway
never caches: each is asked of the store with the key, as S3 takes it, and streamed through.

A GET or HEAD of such an object without the key never gets here: the Reader asks the store,
which refuses it (S3: 400 without the key, 403 with another), and a write with a key leaves
no metadata or block of its object in any cache (`writes.customer_keyed`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing

from gateway import errors
from gateway.service.conditions import ByteRange, Conditions, check_conditions
from gateway.service.reads import ObjectResult
from gateway.service.shared import Shared
from gateway.service.store_errors import store_errors
from gateway.stores import VersionChanged


class EncryptedReads:
    def __init__(self, shared: Shared) -> None:
        self.shared = shared

    async def get(
        self,
        bucket: str,
        key: str,
        rng: ByteRange | None,
        cond: Conditions,
        encryption: Mapping[str, str],
        head: bool,
    ) -> ObjectResult:
        handle = self.shared.mount(bucket)
        if not handle.store.encrypts:  # no object of this store is encrypted
            raise errors.InvalidRequest(
                "The encryption parameters are not applicable to this object."
            )
        with store_errors(key):
            info = await handle.store.stat_encrypted(key, encryption)
        check_conditions(cond, info)
        start, end = rng.resolve(info.size) if rng is not None else (0, info.size)
        body = None
        if not head:
            body = await _primed(
                key, handle.store.read_encrypted(key, encryption, start, end, info.etag)
            )
        return ObjectResult(info, start, end, rng is not None, body, "bypass")


async def _primed(key: str, chunks: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """The body with its first chunk read already: the store's refusal is an S3 error before
    the status line, not a cut connection after it."""
    try:
        with store_errors(key):
            first = await anext(chunks, None)
    except VersionChanged:
        await chunks.aclose()
        raise errors.ServiceUnavailable("The object changed while it was read.") from None
    except BaseException:
        await chunks.aclose()
        raise

    async def rest() -> AsyncGenerator[bytes, None]:
        async with aclosing(chunks):
            if first is not None:
                yield first
            async for chunk in chunks:
                yield chunk

    return rest()
