"""How the CLI reaches jobs: the database directly (`--database-url`), or a node's API
(`--endpoint`, SigV4-signed by botocore with an admin key)."""

from __future__ import annotations

import getpass
import json
import socket
from typing import Any, Protocol

import httpx
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from gateway.jobs.api import PREFIX
from gateway.jobs.db import JobStore
from gateway.jobs.model import JobSpec, JobView, JobWrites
from gateway.meta import MetaStore


class JobsError(Exception):
    """What the API or the database said no with, fit to print."""


class JobsClient(Protocol):
    async def submit(self, spec: JobSpec) -> JobView: ...
    async def get(self, job_id: int) -> JobView | None: ...
    async def recent(self, limit: int = 50) -> list[JobView]: ...
    async def cancel(self, job_id: int) -> JobView | None: ...
    async def close(self) -> None: ...


class DatabaseClient:
    """Jobs straight in the database the nodes share, submitted and cancelled through
    `writes` (the one door for administration)."""

    def __init__(self, meta: MetaStore, writes: JobWrites) -> None:
        self._meta = meta
        self._store = JobStore(meta.engine)
        self._writes = writes

    async def submit(self, spec: JobSpec) -> JobView:
        try:
            who = f"{getpass.getuser()}@{socket.gethostname()}"
            job_id = await self._writes.submit_job(spec, who)
        except ValueError as exc:
            raise JobsError(str(exc)) from None
        job = await self._store.get(job_id)
        assert job is not None
        return job

    async def get(self, job_id: int) -> JobView | None:
        return await self._store.get(job_id)

    async def recent(self, limit: int = 50) -> list[JobView]:
        return await self._store.recent(limit)

    async def cancel(self, job_id: int) -> JobView | None:
        return await self._writes.cancel_job(job_id)

    async def close(self) -> None:
        await self._meta.close()


class HttpClient:
    """Jobs through a node's /_gateway/jobs, each request signed like an S3 request."""

    def __init__(
        self, endpoint: str, access_key: str, secret_key: str, region: str = "us-east-1",
        verify: bool | str = True,
    ) -> None:  # fmt: skip
        self._endpoint = endpoint.rstrip("/")
        self._credentials = Credentials(access_key, secret_key)
        self._region = region
        self._http = httpx.AsyncClient(verify=verify, timeout=30.0)

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        url = self._endpoint + path
        data = b"" if body is None else json.dumps(body).encode()
        request = AWSRequest(method=method, url=url, data=data,
                             headers={"content-type": "application/json"})  # fmt: skip
        request.context["payload_signing_enabled"] = True  # the body's hash is signed
        S3SigV4Auth(self._credentials, "s3", self._region).add_auth(request)
        try:
            response = await self._http.request(
                method, url, content=data, headers=dict(request.headers.items())
            )
        except httpx.HTTPError as exc:
            raise JobsError(f"{self._endpoint}: {exc}") from None
        if response.status_code == 404 and "NoSuchJob" in response.text:
            return None
        try:
            out = response.json()
        except ValueError:
            raise JobsError(f"{url}: {response.status_code} {response.text[:200]}") from None
        if response.status_code >= 300:
            raise JobsError(f"{out.get('error')}: {out.get('message')}")
        return out

    async def submit(self, spec: JobSpec) -> JobView:
        return JobView.from_json(await self._call("POST", PREFIX, spec.to_json()))

    async def get(self, job_id: int) -> JobView | None:
        raw = await self._call("GET", f"{PREFIX}/{job_id}")
        return None if raw is None else JobView.from_json(raw)

    async def recent(self, limit: int = 50) -> list[JobView]:
        return [JobView.from_json(j) for j in await self._call("GET", f"{PREFIX}?limit={limit}")]

    async def cancel(self, job_id: int) -> JobView | None:
        raw = await self._call("POST", f"{PREFIX}/{job_id}/cancel")
        return None if raw is None else JobView.from_json(raw)

    async def close(self) -> None:
        await self._http.aclose()
