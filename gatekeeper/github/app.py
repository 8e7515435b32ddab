"""The ASGI app: POST /webhook (verify, validate, persist, acknowledge), GET /healthz, and GET /evaluations/<id>
(an evaluation's details page, which the check run's details_url links to when `public_url` is set).

Acknowledging is all the request does: the delivery is committed to the database's queue and the worker
threads do the GitHub work, so GitHub gets its answer in milliseconds and a crash loses nothing.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Literal

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gatekeeper.github import signature
from gatekeeper.github.client import GitHubApp
from gatekeeper.github.config import AppConfig
from gatekeeper.github.context import AppContext
from gatekeeper.github.db import open_database
from gatekeeper.github.events import ACTED_ON, EVENT_MODELS, installation_id
from gatekeeper.github.health import Health
from gatekeeper.github.pages import Pages
from gatekeeper.github.queue import DeliveryQueue
from gatekeeper.github.reconcile import Reconciler
from gatekeeper.github.records import Records
from gatekeeper.github.worker import Worker, WorkerProcess
from gatekeeper.report.html import CONTENT_SECURITY_POLICY, render_html
from gatekeeper.verdict import Verdict

log = logging.getLogger(__name__)


class _TooLarge(Exception):
    pass


def create_app(config: AppConfig, workers: Literal["process", "threads", "none"] = "process") -> Starlette:
    """`process`: the workers run in a child process (what `gatekeeper serve` does: acknowledging stays fast
    under load). `threads`: in this process (tests: quicker to start, one process to reason about). `none`:
    no workers here (`gatekeeper serve --role web`): worker processes elsewhere drain the shared database."""
    config.private_key()  # a key that does not parse stops the server here, naming the file (InputError)
    inflight = InflightBodies(config.max_inflight_body_bytes)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Nothing is requeued here: another server may share the database and be running those jobs. What
        # a crashed server was running is taken over by a worker once its lease expires (DeliveryQueue.claim).
        db = open_database(config.db_path, config.db_synchronous)
        queue = DeliveryQueue(db, config.job_lease_s)
        runner: Worker | WorkerProcess | None = None
        reconciler = None
        if workers == "process":
            runner = WorkerProcess(config)
        elif workers == "threads":
            ctx = AppContext(config, queue, Records(db), GitHubApp(config))
            runner, reconciler = Worker(ctx), Reconciler(ctx)
            reconciler.start()
        app.state.queue, app.state.health = queue, Health(config, queue, runner)
        app.state.pages = Pages(db)
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if reconciler is not None:
                reconciler.stop()
            if runner is not None:
                runner.stop()

    async def webhook(request: Request) -> JSONResponse:
        # The signature comes first: nothing about an unauthenticated request is looked at further, and a
        # request that carries none is refused before its body is received (up to 25 MB each, otherwise).
        header = request.headers.get("x-hub-signature-256")
        if not signature.well_formed(header):
            return _error(401, "missing or invalid X-Hub-Signature-256", close=True)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > config.max_body_bytes:
            return _error(413, f"body over {config.max_body_bytes} bytes", close=True)
        mac = signature.hasher(config.webhook_secret.get_secret_value())
        try:
            with inflight.hold() as held:
                chunks = await _read_capped(request, config.max_body_bytes, mac, held)
                if not signature.matches(mac, header):
                    return _error(401, "missing or invalid X-Hub-Signature-256")
                body = b"".join(chunks)  # only now: joining copies the body, and a forged one is not worth a copy
        except _TooLarge:
            return _error(413, f"body over {config.max_body_bytes} bytes", close=True)
        except _Busy:
            return JSONResponse({"error": "too many bodies being received at once; retry"}, status_code=503,
                                headers={"Retry-After": "5", "Connection": "close"})
        media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type != "application/json":
            return _error(415, "set the webhook content type to application/json")
        event = request.headers.get("x-github-event")
        delivery = request.headers.get("x-github-delivery")
        if not event or not delivery:
            return _error(400, "missing X-GitHub-Event or X-GitHub-Delivery")
        model = EVENT_MODELS.get(event)
        if model is None:
            return JSONResponse({"ignored": f"event {event!r} is not handled"}, status_code=202)
        try:
            parsed = model.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "(body)"
            status = 400 if first["type"] == "json_invalid" else 422
            return _error(status, f"{event} payload: {where}: {first['msg']}")
        if event == "ping":
            return JSONResponse({"pong": True, "zen": parsed.zen})
        action = getattr(parsed, "action", None)
        if action not in ACTED_ON.get(event, ()):
            return JSONResponse({"ignored": f"{event}.{action} needs no work"}, status_code=202)
        if installation_id(parsed) is None:
            return _error(422, f"{event} payload has no installation: is this an App webhook?")
        new = await run_in_threadpool(request.app.state.queue.enqueue, delivery, event, action, body)
        if not new:
            return JSONResponse({"duplicate": delivery}, status_code=200)
        return JSONResponse({"queued": delivery}, status_code=202)

    async def healthz(request: Request) -> JSONResponse:
        status, body = await run_in_threadpool(request.app.state.health.report)
        return JSONResponse(body, status_code=status)

    async def evaluation(request: Request) -> Response:
        return await run_in_threadpool(details_page, request.app.state.pages, request.path_params["page_id"])

    return Starlette(
        routes=[Route("/webhook", webhook, methods=["POST"]), Route("/healthz", healthz, methods=["GET"]),
                Route("/evaluations/{page_id}", evaluation, methods=["GET"])],
        lifespan=lifespan,
    )


# The page is the verdict and nothing else: no script may run, nothing is fetched, no other site may frame it,
# and its address (the access to it) is not sent on as a referrer.
PAGE_HEADERS = {"Content-Security-Policy": CONTENT_SECURITY_POLICY + "; frame-ancestors 'none'",
                "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-cache"}


def details_page(pages: Pages, page_id: str) -> Response:
    """An evaluation's details page, rendered from its stored verdict; 404 for an unknown id or a verdict not
    published yet."""
    stored = pages.get(page_id)
    if stored is None or stored.verdict_json is None:
        return HTMLResponse("<!DOCTYPE html><title>Not found</title><p>No published evaluation has this address.",
                            status_code=404, headers=PAGE_HEADERS)
    raw = json.loads(stored.verdict_json)
    verdict = Verdict.model_validate(raw)
    return HTMLResponse(render_html(verdict, subject=stored.subject, raw=raw), headers=PAGE_HEADERS)


class _Busy(Exception):
    pass


class InflightBodies:
    """The bytes of all bodies being received and not yet judged, against one budget. The event loop is the
    only writer, so a plain counter is enough."""

    def __init__(self, budget: int):
        self.budget, self.held = budget, 0

    @contextmanager
    def hold(self) -> Iterator[Callable[[int], None]]:
        taken = 0

        def take(n: int) -> None:
            nonlocal taken
            if self.held + n > self.budget:
                raise _Busy
            self.held += n
            taken += n

        try:
            yield take
        finally:
            self.held -= taken


async def _read_capped(request: Request, limit: int, mac: hmac.HMAC, take: Callable[[int], None]) -> list[bytes]:
    """The body's chunks, fed to `mac` as they arrive; refused as soon as they pass `limit` (or the budget of
    all bodies in flight, through `take`), so no more is ever held."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        take(len(chunk))
        mac.update(chunk)
        chunks.append(chunk)
    return chunks


def _error(status: int, message: str, close: bool = False) -> JSONResponse:
    # close: the rest of the body is not wanted; without it the server would read (and drop) all of it to
    # keep the connection alive.
    return JSONResponse({"error": message}, status_code=status, headers={"Connection": "close"} if close else None)
