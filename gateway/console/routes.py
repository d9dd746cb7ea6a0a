"""The operator console at /_gateway/console/: server-rendered pages (Jinja2) whose live parts
are fragments htmx polls every 2 s, and forms that post through htmx with the session's CSRF
token. Every request but the login page's and the static files' needs a signed-in session of
an admin key (checked against the database each time: a deleted or disabled key's session
ends); a page without one redirects to the login page, a fragment or a POST gets 401 (htmx is
told to go to the login page), a POST without the session's CSRF token 403. Failed sign-ins
are limited per key and per client address (signin.py): 429 past the limit.

Nothing here is on the S3 request path: the node routes /_gateway/console to this app only.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import html
import math
import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import Message, Receive, Scope, Send

from gateway.admin import MAX_JOB_ID, Administration, Invalid
from gateway.cluster.registry import MountLine, NodeFigures, NodeRegistry
from gateway.iam import BUILTIN, DEFAULT_USER_POLICY, may_operate
from gateway.jobs import progress
from gateway.jobs.db import JobStore
from gateway.jobs.model import JobView
from gateway.meta import (
    AccessKeyExists,
    InUse,
    MetaStore,
    MetaUnavailable,
    NoSuchPolicy,
    NoSuchUser,
    UserExists,
)
from gateway.service.shared import Shared

from . import figures
from .sessions import COOKIE, Session, Sessions, SignedOut
from .signin import SignInLimits

PREFIX = "/_gateway/console"
LOGIN = f"{PREFIX}/login"
HOME = f"{PREFIX}/fleet"
POLL = "every 2s"  # htmx's trigger of the live fragments
_HERE = Path(__file__).parent
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
    # htmx is a file of ours; it adds one <style> of its own, hence the inline styles.
    "Content-Security-Policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "frame-ancestors 'none'; form-action 'self'",
}
SIGN_INS = "console-signins"  # the failed sign-ins the node's workers share (signin.py)
# Where a node kept the sessions ended by logout before migration 0009 (now a table): read
# once into the table and removed (sessions.py).
SIGNED_OUT = "console-signed-out"
_RAW_HEADERS = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in _HEADERS.items()]
_MAX_FORM = 64 << 10  # bytes of a posted form
# What each path parameter of the actions names, for an answer that refuses it.
_PATH_PARTS = {"access_key": "access key", "name": "user", "policy": "policy"}
_NO_KEY_SECRET = "x" * 40  # compared against when the key is unknown: the same work either way

Handler = Callable[[Request, Session], Awaitable[Response]]


def is_console_path(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


class Console:
    """The ASGI app behind PREFIX, over the node's database, namespace and page store; every
    change it makes goes through the one door for administration (`admin`). `clock`
    (seconds since the epoch) decides sessions' expiry and when failed sign-ins stop
    counting."""

    def __init__(
        self,
        meta: MetaStore,
        shared: Shared,
        admin: Administration,
        heartbeat_timeout: float,
        clock: Callable[[], float] = time.time,
        figures: Callable[[], NodeFigures] | None = None,
    ) -> None:
        """`figures`: this node's cache figures, every worker's (gateway/node.node_figures);
        without it, none (a console built for its pages alone, in tests)."""
        self._meta = meta
        self._figures = figures or NodeFigures
        self._shared = shared
        self._admin = admin
        self._jobs = JobStore(meta.engine)
        self._registry = NodeRegistry(meta.engine, heartbeat_timeout)
        self._clock = clock
        self.sessions = Sessions(meta.derive_key("console-session"), clock)
        # Shared by the node's workers, in its cache dir (without one: this process's own).
        folder = shared.pages.root if shared is not None else None
        self.sign_ins = SignInLimits(clock, folder and os.path.join(folder, SIGN_INS))
        legacy = folder and os.path.join(folder, SIGNED_OUT)
        self.signed_out = SignedOut(meta.engine, clock, legacy)
        self._templates = Jinja2Templates(directory=_HERE / "templates")
        self._templates.env.filters.update(size=_size, percent=_percent, seconds=_seconds)
        self._app = Starlette(routes=[Mount(PREFIX, routes=self._routes())])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Every answer carries the security headers: pages, fragments, redirects, static
        files, 404s and 405s alike."""

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                have = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(n.lower(), v) for n, v in _RAW_HEADERS if n.lower() not in have]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self._app(scope, receive, send_with_headers)

    def _routes(self) -> list[Route | Mount]:
        page, live, act = self._page, self._live, self._action
        return [
            Route("/", self._home),
            Route("/login", self._login_form, methods=["GET"]),
            Route("/login", self._login, methods=["POST"]),
            Route("/logout", act(self._logout), methods=["POST"]),
            Mount("/static", StaticFiles(directory=_HERE / "static"), name="static"),
            Route("/fleet", page("fleet.html", self._fleet)),
            Route("/fleet/live", live("fleet_live.html", self._fleet)),
            Route("/mounts", page("mounts.html", self._mounts)),
            Route("/mounts/live", live("mounts_live.html", self._mounts)),
            Route("/jobs", page("jobs.html", self._job_list)),
            Route("/jobs/live", live("jobs_live.html", self._job_list)),
            Route("/jobs", act(self._start_job), methods=["POST"]),
            Route("/jobs/{job_id:int}/cancel", act(self._cancel_job), methods=["POST"]),
            Route("/users", page("users.html", self._users)),
            Route("/users/live", live("users_live.html", self._users)),
            Route("/users", act(self._create_user), methods=["POST"]),
            Route("/users/{name}/delete", act(self._delete_user), methods=["POST"]),
            Route("/policies/attach", act(self._attach), methods=["POST"]),
            Route("/users/{name}/detach/{policy}", act(self._detach), methods=["POST"]),
            Route("/keys", act(self._create_key), methods=["POST"]),
            Route("/keys/{access_key}/delete", act(self._delete_key), methods=["POST"]),
            Route("/keys/{access_key}/disable", act(self._disable_key), methods=["POST"]),
            Route("/keys/{access_key}/enable", act(self._enable_key), methods=["POST"]),
            Route("/cache", page("cache.html", self._cache_form)),
            Route("/cache", act(self._check_cache), methods=["POST"]),
            Route("/cache/{job_id:int}/live", live("cache_live.html", self._cache_job)),
        ]

    # -- sessions

    async def _session(self, request: Request) -> Session | None:
        """The request's signed-in session, if its key still exists, is an admin key and is
        not disabled."""
        session = self.sessions.read(request.cookies.get(COOKIE))
        if session is None or not session.signed_in or await self.signed_out.holds(session):
            return None
        key = await self._meta.get_key(session.access_key)
        if key is None or key.disabled or not await self._operator(key.access_key, key.admin):
            return None
        return session

    async def _operator(self, access_key: str, admin: bool) -> bool:
        """Whether the key may use the console: marked admin, of a user holding `admin`."""
        if not admin:
            return False
        rows = await self._meta.read_tenancy()
        user = rows.key_users.get(access_key)
        _, held = rows.users.get(user if user is not None else rows.admin_id or -1, ("", ()))
        return may_operate(admin, held)

    def _render(
        self, request: Request, name: str, context: dict[str, Any], session: Session | None,
        status: int = 200,
    ) -> Response:  # fmt: skip
        values = {
            "base": PREFIX, "poll": POLL, "session": session,
            "csrf": self.sessions.csrf_token(session) if session else "", **context,
        }  # fmt: skip
        response = self._templates.TemplateResponse(request, name, values, status_code=status)
        response.headers.update(_HEADERS)
        return response

    def _set_cookie(self, request: Request, response: Response, value: str, ttl: float) -> None:
        response.set_cookie(
            COOKIE, value, max_age=int(ttl), path=PREFIX, httponly=True, samesite="strict",
            secure=request.url.scheme == "https",
        )  # fmt: skip

    def _page(
        self, template: str, context: Callable[[Request], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A whole page: without a session, a redirect to the login page."""

        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if session is None:
                return RedirectResponse(LOGIN, 303)
            return self._render(request, template, await context(request), session)

        return endpoint

    def _live(
        self, template: str, context: Callable[[Request], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        """A fragment htmx polls: without a session, 401 (and htmx goes to the login page)."""

        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if session is None:
                return _refused(401, "sign in first")
            return self._render(request, template, await context(request), session)

        return endpoint

    def _action(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """A POST: 401 without a session, 400 for a NUL in the path's names or in the form
        (before anything of them reaches the database), 403 without its CSRF token (form
        field `csrf` or header X-CSRF-Token)."""

        async def endpoint(request: Request) -> Response:
            session = await self._session(request)
            if session is None:
                return _refused(401, "sign in first")
            for name, value in request.path_params.items():
                if isinstance(value, str) and "\x00" in value:
                    said = f"The {_PATH_PARTS.get(name, name)} in the path holds a NUL character"
                    return _refused(400, f"{said}: no name has one.")
            try:
                form = await _form(request)
            except NulInForm as exc:
                return _refused(400, html.escape(str(exc)))
            token = request.headers.get("x-csrf-token") or form.get("csrf")
            if not isinstance(token, str) or not self.sessions.csrf_ok(session, token):
                return _refused(403, "the form's CSRF token is missing or wrong")
            return await handler(request, session)

        return endpoint

    async def _home(self, request: Request) -> Response:
        return RedirectResponse(HOME, 303)

    async def _login_form(self, request: Request) -> Response:
        session = self.sessions.read(request.cookies.get(COOKIE))
        if session is not None and session.signed_in and await self._session(request):
            return RedirectResponse(HOME, 303)
        return self._login_page(request, session, "", 200)

    def _login_page(
        self, request: Request, session: Session | None, error: str, status: int
    ) -> Response:
        """The login form, under the visitor's anonymous session (a new one if it has none)."""
        cookie = None
        if session is None or session.signed_in:
            session, cookie = self.sessions.issue()
        response = self._render(request, "login.html", {"error": error}, session, status)
        if cookie is not None:
            self._set_cookie(request, response, cookie, session.expires - self._clock())
        return response

    async def _login(self, request: Request) -> Response:
        """Sign in with an admin access key and its secret: a new session on success; 401 for
        a wrong key or secret, 403 for a key that is not an admin key, a disabled key or a bad
        CSRF token; 429, whatever the secret, for a key or a client address past the limit of
        failed sign-ins."""
        before = self.sessions.read(request.cookies.get(COOKIE))
        try:
            form = await _form(request)
        except NulInForm as exc:
            return self._login_page(request, before, str(exc), 400)
        token = form.get("csrf")
        if before is None or not isinstance(token, str) or not self.sessions.csrf_ok(before, token):
            return self._login_page(request, None, "The form expired: please sign in again.", 403)
        access_key, secret = str(form.get("access_key", "")), str(form.get("secret_key", ""))
        client = request.client.host if request.client else None
        wait = await self.sign_ins.retry_after(access_key, client)
        if wait > 0:
            seconds = math.ceil(wait)
            said = f"Too many failed sign-ins: try again in {seconds} s."
            response = self._login_page(request, before, said, 429)
            response.headers["Retry-After"] = str(seconds)
            return response
        key = await self._meta.get_key(access_key) if access_key else None
        expected = key.secret_key if key is not None else _NO_KEY_SECRET
        if not hmac.compare_digest(secret.encode(), expected.encode()) or key is None:
            await self.sign_ins.failed(access_key, client)
            return self._login_page(request, before, "Wrong access key or secret.", 401)
        await self.sign_ins.succeeded(access_key, client)
        if key.disabled:
            return self._login_page(request, before, f"{access_key} is disabled.", 403)
        if not await self._operator(key.access_key, key.admin):
            said = f"{access_key} is not an admin key of a user holding the admin policy."
            return self._login_page(request, before, said, 403)
        session, cookie = self.sessions.issue(key.access_key)
        response = RedirectResponse(HOME, 303)
        self._set_cookie(request, response, cookie, session.expires - self._clock())
        return response

    async def _logout(self, request: Request, session: Session) -> Response:
        await self.signed_out.add(session)  # a copy of the cookie ends too
        response = RedirectResponse(LOGIN, 303)
        response.delete_cookie(COOKIE, path=PREFIX, httponly=True, samesite="strict")
        if request.headers.get("hx-request"):
            response.headers["HX-Redirect"] = LOGIN
        return response

    # -- fleet

    async def _fleet(self, request: Request) -> dict[str, Any]:
        records = await self._registry.read()
        now, rows = await self._registry.samples(figures.WINDOW)
        found = figures.series(now, rows)
        nodes = []
        for record in records:
            line = found.get(record.node.id, figures.NodeSeries())
            nodes.append({
                **record.summary(), "capacity": line.capacity_bytes, "rps": line.requests_now,
                "rps_chart": figures.sparkline(line.requests_per_s),
                "hits_chart": figures.sparkline(line.hit_ratio, top=1.0),
                "cache_chart": figures.sparkline(line.cache_bytes, top=line.capacity_bytes),
            })  # fmt: skip
        if self._shared.fleet is None and not nodes:
            nodes.append(await self._alone())
        live = sum(1 for n in nodes if n["live"])
        return {"nodes": nodes, "live": live, "page": "fleet"}

    async def _alone(self) -> dict[str, Any]:
        """A node in no fleet writes no heartbeats and no samples: its row is what it knows of
        itself now (no history, no request rate)."""
        here = await asyncio.to_thread(self._figures)
        return {
            "id": "this node", "address": "not in a fleet", "zone": None, "weight": 1.0,
            "state": "alone", "live": True, "heartbeat_age": 0.0, **here.summary(),
            "capacity": self._shared.pages.capacity,
            "rps": None, "rps_chart": "", "hits_chart": "", "cache_chart": "",
        }  # fmt: skip

    # -- mounts

    async def _mounts(self, request: Request) -> dict[str, Any]:
        handles = {h.bucket: h for h in self._shared.namespace.mounts()}
        stats = await asyncio.to_thread(self._shared.pages.janitor_stats)
        here = {m.mount: m for m in (await asyncio.to_thread(self._figures)).mounts}
        rows = []
        for mount in await self._meta.list_mounts():
            h = handles.get(mount.bucket)
            used = stats.mounts.get(mount.id) if stats is not None else None
            rows.append({
                "bucket": mount.bucket, "uri": mount.uri,
                "options": sorted(mount.public_options().items()),
                "cache": None if h is None else h.cache_enabled,
                "ttl": None if h is None else h.ttl,
                "block_size": None if h is None else h.block_size,
                "replicas": None if h is None else h.replicas,
                "pins": () if h is None else h.pins,
                "quota": None if h is None else h.quota,
                "catalog": h is not None and h.catalog is not None,
                "used_here": used,
                "here": here.get(mount.bucket, MountLine(mount.bucket)).summary(),
            })  # fmt: skip
        return {"mounts": rows, "page": "mounts"}

    # -- jobs

    async def _job_list(self, request: Request, message: str = "") -> dict[str, Any]:
        jobs = await self._jobs.recent(30)
        buckets = sorted(h.bucket for h in self._shared.namespace.mounts())
        return {
            "jobs": [_job_row(job, _now()) for job in jobs], "buckets": buckets,
            "message": message, "page": "jobs",
        }  # fmt: skip

    async def _start_job(self, request: Request, session: Session) -> Response:
        """A preload ("load") or a catalog sync ("sync": --metadata-only) of a prefix, through
        the jobs API's own submit."""
        form = await _form(request)
        kind = str(form.get("kind", "load"))
        options: dict[str, Any] = {
            "bucket": str(form.get("bucket", "")), "prefix": str(form.get("prefix", "")),
            "pin": form.get("pin") == "on" and kind == "load", "metadata_only": kind == "sync",
        }  # fmt: skip
        try:
            job_id = await self._admin.submit_job(options, session.access_key)
            message = f"job {job_id} submitted"
        except (ValueError, TypeError) as exc:
            message = f"refused: {exc}"
        context = await self._job_list(request, message)
        return self._render(request, "jobs_live.html", context, session)

    async def _cancel_job(self, request: Request, session: Session) -> Response:
        job_id = int(request.path_params["job_id"])
        found = await self._admin.cancel_job(job_id)
        message = f"job {job_id} {found.state}" if found else f"no job {job_id}"
        context = await self._job_list(request, message)
        return self._render(request, "jobs_live.html", context, session)

    # -- users and keys

    async def _users(self, request: Request) -> dict[str, Any]:
        users = await self._meta.list_users()
        keys = {k.access_key: k for k in await self._meta.list_keys()}
        custom = await self._meta.custom_policies()
        rows = [
            {"name": u.name, "policies": u.policies, "buckets": u.buckets,
             "created": u.created_at, "keys": [keys[k] for k in u.keys if k in keys]}
            for u in users
        ]  # fmt: skip
        return {
            "users": rows, "policies": [*BUILTIN, *sorted(custom)],
            "default_policy": DEFAULT_USER_POLICY, "page": "users",
        }  # fmt: skip

    def _result(self, request: Request, session: Session, message: str, **more: Any) -> Response:
        return self._render(request, "result.html", {"message": message, **more}, session)

    async def _create_user(self, request: Request, session: Session) -> Response:
        form = await _form(request)
        name, policy = str(form.get("name", "")), str(form.get("policy", DEFAULT_USER_POLICY))
        try:
            await self._admin.create_user(name, (policy,))
        except (Invalid, NoSuchPolicy) as exc:
            return self._result(request, session, str(exc))
        except UserExists:
            return self._result(request, session, f"user {name!r} exists")
        return self._result(request, session, f"created user {name} with policy {policy}")

    async def _delete_user(self, request: Request, session: Session) -> Response:
        name = request.path_params["name"]
        try:
            await self._admin.delete_user(name)
        except (NoSuchUser, InUse) as exc:
            return self._result(request, session, str(exc))
        return self._result(request, session, f"deleted user {name}")

    async def _attach(self, request: Request, session: Session) -> Response:
        form = await _form(request)
        name, policy = str(form.get("user", "")), str(form.get("policy", ""))
        try:
            added = await self._admin.attach_policy(name, policy)
        except (NoSuchPolicy, NoSuchUser) as exc:
            return self._result(request, session, str(exc))
        said = f"attached {policy} to {name}" if added else f"{name} holds {policy} already"
        return self._result(request, session, said)

    async def _detach(self, request: Request, session: Session) -> Response:
        name, policy = request.path_params["name"], request.path_params["policy"]
        try:
            gone = await self._admin.detach_policy(name, policy)
        except NoSuchUser as exc:
            return self._result(request, session, str(exc))
        said = f"detached {policy} from {name}" if gone else f"{name} does not hold {policy}"
        return self._result(request, session, said)

    async def _create_key(self, request: Request, session: Session) -> Response:
        """A key with a generated secret, shown in this answer only."""
        form = await _form(request)
        user = str(form.get("user", "")) or None
        description = str(form.get("description", ""))
        try:
            key = await self._admin.create_key(
                None, None, description, admin=form.get("admin") == "on", user=user
            )
        except (NoSuchUser, AccessKeyExists) as exc:
            return self._result(request, session, str(exc))
        return self._result(request, session, f"created a key for {user or 'admin'}", key=key)

    async def _delete_key(self, request: Request, session: Session) -> Response:
        access_key = request.path_params["access_key"]
        if not await self._admin.delete_key(access_key):
            return self._result(request, session, f"no access key {access_key}")
        return self._result(request, session, f"deleted key {access_key}")

    async def _disable_key(self, request: Request, session: Session) -> Response:
        return await self._set_disabled(request, session, True)

    async def _enable_key(self, request: Request, session: Session) -> Response:
        return await self._set_disabled(request, session, False)

    async def _set_disabled(self, request: Request, session: Session, disabled: bool) -> Response:
        """Disable or enable a key; this process's namespace re-reads the keys at once, the
        other workers and nodes at their next refresh (refresh_interval)."""
        access_key = request.path_params["access_key"]
        if not await self._admin.set_key_disabled(access_key, disabled):
            return self._result(request, session, f"no access key {access_key}")
        with contextlib.suppress(MetaUnavailable):  # the periodic refresh will see it
            await self._shared.namespace.refresh_keys()
        said = "disabled" if disabled else "enabled"
        return self._result(request, session, f"{said} key {access_key}")

    # -- the cache of a prefix (a --verify job)

    async def _cache_form(self, request: Request) -> dict[str, Any]:
        buckets = sorted(h.bucket for h in self._shared.namespace.mounts())
        return {"buckets": buckets, "job": None, "page": "cache"}

    async def _check_cache(self, request: Request, session: Session) -> Response:
        """Count what of a prefix is cached where reads look for it: `gateway load --verify`."""
        form = await _form(request)
        options = {
            "bucket": str(form.get("bucket", "")), "prefix": str(form.get("prefix", "")),
            "verify": True,
        }  # fmt: skip
        try:
            job_id = await self._admin.submit_job(options, session.access_key)
        except (ValueError, TypeError) as exc:
            context = {"job": None, "message": f"refused: {exc}"}
            return self._render(request, "cache_live.html", context, session)
        context = await self._cache_job(request, job_id)
        return self._render(request, "cache_live.html", context, session)

    async def _cache_job(self, request: Request, job_id: int | None = None) -> dict[str, Any]:
        if job_id is None:
            job_id = int(request.path_params["job_id"])
        job = await self._jobs.get(job_id) if job_id <= MAX_JOB_ID else None
        if job is None:
            return {"job": None, "message": f"no job {job_id}"}
        cached = job.cached_bytes
        nodes = [
            {"id": n.node, "objects": n.cached_objects, "bytes": n.cached_bytes,
             "share": n.cached_bytes / job.total_bytes if job.total_bytes else None}
            for n in job.nodes
        ]  # fmt: skip
        share = min(1.0, cached / job.total_bytes) if job.total_bytes else None
        return {"job": _job_row(job, _now()), "nodes": nodes, "cached": cached, "share": share}


class NulInForm(ValueError):
    """A posted form with a NUL in a field: no name, key, prefix or secret holds one (and
    PostgreSQL takes none in text), so the form is refused whole, naming the field."""

    def __init__(self, field: str) -> None:
        shown = field.replace("\x00", "\\0")[:64]
        super().__init__(f"The form's field {shown} holds a NUL character: no value has one.")


async def _form(request: Request) -> dict[str, str]:
    """The posted form (URL-encoded, as browsers and htmx send it), read once per request;
    a body past _MAX_FORM is not read at all (an empty form, which every action refuses).
    NulInForm for a form with a NUL in a field's name or value."""
    form: dict[str, str] | None = getattr(request.state, "form", None)
    if form is None:
        body = b""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) <= _MAX_FORM:
            body = await request.body()
        pairs = urllib.parse.parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        for name, value in pairs:
            if "\x00" in name or "\x00" in value:
                raise NulInForm(name)
        form = request.state.form = dict(pairs)
    return form


def _refused(status: int, message: str) -> Response:
    headers = dict(_HEADERS)
    if status == 401:
        headers["HX-Redirect"] = LOGIN
    return HTMLResponse(f"<p>{message}</p>", status, headers=headers)


def _now() -> datetime:
    return datetime.now(UTC)


def _job_row(job: JobView, now: datetime) -> dict[str, Any]:
    """A job as the pages show it: its progress, rate (bytes a second since it started) and
    the time left at that rate."""
    fraction = progress.done_fraction(job) if job.state != "done" else 1.0
    rate = eta = None
    if job.started_at is not None:
        spent = ((job.ended_at or now) - job.started_at).total_seconds()
        rate = job.bytes_done / spent if spent > 0 else None
        if rate and not job.ended and job.listed:
            eta = max(0.0, (job.total_bytes - job.bytes_done) / rate)
    return {
        "id": job.id, "kind": job.spec.kind, "bucket": job.spec.bucket,
        "prefix": job.spec.prefix, "state": job.state, "message": job.message,
        "fraction": fraction, "objects_done": job.objects_done,
        "total_objects": job.total_objects, "bytes_done": job.bytes_done,
        "total_bytes": job.total_bytes, "listed": job.listed, "rate": rate, "eta": eta,
        "failures": job.failures, "errors": job.errors[:3], "ended": job.ended,
        "submitted_by": job.submitted_by,
    }  # fmt: skip


def _size(count: float | None) -> str:
    return "-" if count is None else progress.size(int(count))


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    minutes, seconds = divmod(int(value), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes}:{seconds:02d}"
