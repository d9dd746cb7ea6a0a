"""The operator API for jobs on the node's S3 port, JSON in and out:

    POST /_gateway/jobs               submit (a JobSpec as JSON)        -> 201 the job
    GET  /_gateway/jobs[?limit=N]     the newest jobs                   -> 200 [jobs]
    GET  /_gateway/jobs/ID            one job, with per-node progress  -> 200 the job
    POST /_gateway/jobs/ID/cancel     cancel it                         -> 200 the job

Every request is signed with SigV4 (as an S3 request is, the payload's SHA-256 included) by an
access key marked admin (`gateway keys create --admin`) and not disabled; anything else gets
403.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from gateway import errors
from gateway.iam import may_operate
from gateway.jobs.db import JobStore, UnknownBucket
from gateway.jobs.model import JobWrites
from gateway.meta import MetaStore
from gateway.s3.sigv4 import SigV4Verifier

PREFIX = "/_gateway/jobs"
_ONE = re.compile(rf"^{PREFIX}/([0-9]+)$")
_CANCEL = re.compile(rf"^{PREFIX}/([0-9]+)/cancel$")
_MAX_BODY = 64 << 10
_MAX_DEPTH = 8  # levels of JSON in a job's options (they use two)
MAX_ID = (1 << 63) - 1  # a job id in the database (BIGINT): past it, no such job


def is_jobs_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class JobsApi:
    """The ASGI app behind PREFIX: jobs read from `store`, submitted and cancelled through
    `writes` (the one door for administration, which wakes this node's job loop)."""

    def __init__(self, store: JobStore, meta: MetaStore, writes: JobWrites) -> None:
        self._store = store
        self._meta = meta
        self._writes = writes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            body = await _body(request)
            who = await self._authenticate(scope, body)
            response = await self._handle(request, body, who)
        except errors.S3Error as exc:
            response = JSONResponse({"error": exc.code, "message": exc.detail}, exc.status)
        await response(scope, receive, send)

    async def _authenticate(self, scope: Scope, body: bytes) -> str:
        """The admin access key that signed the request; 403 for any other (a disabled key
        is one that does not exist: InvalidAccessKeyId)."""
        keys = {k.access_key: k for k in await self._meta.list_keys() if not k.disabled}
        verifier = SigV4Verifier(lambda ak: keys[ak].secret_key if ak in keys else None)
        raw = scope.get("raw_path")
        raw_path = raw.decode("latin-1") if raw else scope["path"]
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]},{text}" if key in headers else text
        query = scope.get("query_string", b"").decode("latin-1")
        result = verifier.verify(scope["method"], raw_path, query, headers)
        if result is None:
            raise errors.AccessDenied("The jobs API takes requests signed by an admin key.")
        if result.payload_hash != hashlib.sha256(body).hexdigest():
            raise errors.AccessDenied("The body's SHA-256 must be signed (x-amz-content-sha256).")
        rows = await self._meta.read_tenancy()
        user = rows.key_users.get(result.access_key)
        _, held = rows.users.get(user if user is not None else rows.admin_id or -1, ("", ()))
        if not may_operate(keys[result.access_key].admin, held):
            raise errors.AccessDenied(
                f"{result.access_key} is not an admin key of a user holding the admin policy."
            )
        return result.access_key

    async def _handle(self, request: Request, body: bytes, who: str) -> Response:
        path, method = request.url.path, request.method
        if path == PREFIX and method == "POST":
            try:
                job_id = await self._writes.submit_job(_json(body), who)
            except (ValueError, TypeError) as exc:
                code = "NoSuchBucket" if isinstance(exc, UnknownBucket) else "InvalidArgument"
                status = 404 if isinstance(exc, UnknownBucket) else 400
                return JSONResponse({"error": code, "message": str(exc)}, status)
            return await self._one(job_id, 201)
        if path == PREFIX and method == "GET":
            try:
                limit = int(request.query_params.get("limit", "50"))
            except ValueError:
                limit = 50
            jobs = await self._store.recent(max(1, min(limit, 1000)))
            return JSONResponse([job.to_json() for job in jobs])
        if (m := _ONE.match(path)) and method == "GET":
            return await self._one(int(m.group(1)))
        if (m := _CANCEL.match(path)) and method == "POST":
            job_id = int(m.group(1))
            if await self._writes.cancel_job(job_id) is None:
                return _missing(job_id)
            return await self._one(job_id)
        return JSONResponse({"error": "NotFound", "message": f"no {method} {path}"}, 404)

    async def _one(self, job_id: int, status: int = 200) -> Response:
        job = await self._store.get(job_id) if job_id <= MAX_ID else None
        if job is None:
            return _missing(job_id)
        return JSONResponse(job.to_json(), status)


def _missing(job_id: int) -> Response:
    return JSONResponse({"error": "NoSuchJob", "message": f"no job {job_id}"}, 404)


async def _body(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > _MAX_BODY:
            raise errors.InvalidArgument("The request body is too large for the jobs API.")
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: bytes) -> dict[str, Any]:
    try:
        raw = json.loads(body or b"{}")
    except RecursionError:
        raise ValueError("the body is nested too deep") from None
    except ValueError as exc:
        raise ValueError(f"the body is not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("the body is a JSON object of job options")
    _check_values(raw)
    return raw


def _check_values(value: Any, depth: int = 0) -> None:
    """ValueError for what no job option is and the database cannot store: text with a NUL,
    a whole number past 64 bits, a number that is not finite, nesting past a few levels."""
    if depth > _MAX_DEPTH:
        raise ValueError("the body is nested too deep")
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError("a job option has a NUL character")
    elif isinstance(value, bool):
        pass
    elif isinstance(value, int):
        if not -MAX_ID - 1 <= value <= MAX_ID:
            raise ValueError(f"a number past 64 bits: {str(value)[:24]}...")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("a number that is not finite")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_values(key, depth + 1)
            _check_values(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_values(item, depth + 1)
