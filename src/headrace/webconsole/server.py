"""The web console's HTTP server (aiohttp): a JSON API over :class:`ClusterSource` and one
static page (``static/``: index.html, app.js, style.css, and Plotly.js from the ``plotly``
package).

Shape:

- A sampler task asks the cluster for a snapshot every ``interval_s`` (in a worker
  thread) and records the series for the charts (:class:`model.Samples`). The overview,
  topic and group tables are served from the latest snapshot, so any number of open pages
  costs the cluster one sample per interval. Creating a topic wakes the sampler at once.
- A failed sample keeps the previous snapshot and says why (``error`` in every table
  response, one log line when the cluster stops or starts answering). Any error other
  than a Kafka or API error ends the sampler, and the server with it (exit 1): nothing
  runs unsupervised.
- Detail pages (one topic, one group) and the message browser ask the cluster on each
  request, in the same bounded pool of worker threads; each such wait is bounded.
- Hostile input: every parameter is validated (:mod:`model`), bodies are limited to
  ``MAX_BODY_BYTES``, POST needs ``application/json`` and a same-origin ``Origin`` (no
  cross-site form posts); bound to a loopback address the server only answers requests
  whose ``Host`` is that address (no DNS rebinding). Errors are JSON ``{"error": ...}``
  with a 4xx/5xx status and never a traceback in the log (unless ``--verbose``).

Shutdown (SIGTERM, Ctrl-C) is ordered and bounded: stop the sampler, stop the site
(``shutdown_timeout``), close the worker pool without waiting for a stuck librdkafka call.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import ipaddress
import json
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from headrace.webconsole.model import (
    ApiError,
    BadRequest,
    Forbidden,
    NotFound,
    Samples,
    Unavailable,
    group_id,
    is_stale,
    message_query,
    new_topic_request,
    topic_name,
)
from headrace.webconsole.source import ClusterSource

T = TypeVar("T")
log = logging.getLogger("headrace.console")

MAX_BODY_BYTES = 64 * 1024
WORKERS = 8
STATIC = ("index.html", "app.js", "style.css")
_CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data: blob:; connect-src 'self'; object-src 'none'; "
        "base-uri 'none'; frame-ancestors 'none'; form-action 'self'")


def plotly_js_path() -> Path:
    """Plotly.js as the pinned ``plotly`` package ships it (no CDN, nothing vendored)."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise RuntimeError("the plotly package is not installed (pip install plotly)")
    return Path(spec.origin).parent / "package_data" / "plotly.min.js"


class Console:
    """The console's state: the latest snapshot, the sampled series, the worker pool."""

    def __init__(self, source: ClusterSource, interval_s: float, verbose: bool = False
                 ) -> None:
        self.source = source
        self.interval_s = interval_s
        self.verbose = verbose
        self.samples = Samples()
        self.snapshot: dict[str, Any] | None = None
        self.error: str | None = None
        self.error_since_ms: int | None = None
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="headrace-console")
        self.wait_s = source.timeout_s * 3 + 5  # a bound on any one blocking job
        self._wake: asyncio.Event | None = None
        self.browsing = asyncio.Semaphore(4)  # message browser consumers at once
        self.allowed_hosts: set[str] | None = None

    async def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, waited for at most ``wait_s``."""
        loop = asyncio.get_running_loop()
        try:
            return await asyncio.wait_for(loop.run_in_executor(self.pool, fn, *args),
                                          self.wait_s)
        except TimeoutError:
            raise Unavailable(f"no answer within {self.wait_s:.0f} s") from None

    # ------------------------------------------------------------ sampling

    def record(self, snap: dict[str, Any]) -> None:
        self.snapshot = snap
        self.samples.record(snap["time_ms"], snap["high_watermarks"],
                            {g["group"]: g["lag"] for g in snap["groups"]})
        if self.error is not None:
            log.info("the cluster answers again (%s)", self.source.bootstrap)
        self.error = self.error_since_ms = None

    def sample_failed(self, e: ApiError) -> None:
        if self.error is None:
            log.warning("sampling failed: %s", e.message)
            self.error_since_ms = int(time.time() * 1000)
        self.error = e.message

    async def sample_once(self) -> None:
        try:
            self.record(await self.blocking(self.source.snapshot))
        except ApiError as e:
            self.sample_failed(e)

    async def sample_forever(self) -> None:
        self._wake = asyncio.Event()
        while True:
            started = time.monotonic()
            await self.sample_once()
            left = self.interval_s - (time.monotonic() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(left, 0.05))
            self._wake.clear()

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def status(self, now_ms: int | None = None) -> dict[str, Any]:
        snap = self.snapshot or {}
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        return {"sampled_at_ms": snap.get("time_ms"), "error": self.error,
                "error_since_ms": self.error_since_ms,
                "stale": is_stale(now_ms, snap.get("time_ms"), self.interval_s)}


# ---------------------------------------------------------------- middleware


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@web.middleware
async def _guard(request: web.Request, handler: Callable[[web.Request],
                                                         Awaitable[web.StreamResponse]]
                 ) -> web.StreamResponse:
    """Host and Origin checks, JSON errors, security headers."""
    console: Console = request.app["console"]
    try:
        if console.allowed_hosts is not None and request.host not in console.allowed_hosts:
            raise BadRequest(f"unexpected Host header {request.host[:100]!r}")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("Origin")
            if origin is not None and origin != f"{request.scheme}://{request.host}":
                raise Forbidden("cross-origin requests are refused")
            if request.content_type != "application/json":
                raise BadRequest("expected Content-Type: application/json")
        response = await handler(request)
    except ApiError as e:
        response = web.json_response({"error": e.message}, status=e.status)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        response = web.json_response({"error": e.reason}, status=e.status)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.error("%s %s failed: %s: %s", request.method, request.path[:200],
                  type(e).__name__, e, exc_info=console.verbose)
        response = web.json_response({"error": "internal error (see the console's log)"},
                                     status=500)
    response.headers["Content-Security-Policy"] = _CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    return response


# ---------------------------------------------------------------- handlers


def _console(request: web.Request) -> Console:
    c: Console = request.app["console"]
    return c


def _ok(doc: Any) -> web.Response:
    return web.json_response(doc, dumps=lambda d: json.dumps(d, ensure_ascii=False))


async def index(request: web.Request) -> web.StreamResponse:
    return _static_response("index.html")


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name == "plotly.min.js":
        resp = web.FileResponse(plotly_js_path(), headers={
            "Content-Type": "text/javascript", "Cache-Control": "max-age=86400"})
        return resp
    if name not in STATIC:
        raise NotFound(f"no such file {name[:100]!r}")
    return _static_response(name)


async def _no_content() -> web.Response:
    return web.Response(status=204)


def _static_response(name: str) -> web.Response:
    body = resources.files("headrace.webconsole").joinpath("static", name).read_bytes()
    return web.Response(body=body, content_type=_CONTENT_TYPES[Path(name).suffix],
                        charset="utf-8", headers={"Cache-Control": "no-cache"})


async def config(request: web.Request) -> web.Response:
    from headrace import __version__

    c = _console(request)
    return _ok({"interval_s": c.interval_s, "bootstrap": c.source.bootstrap,
                "version": __version__, **c.status()})


async def cluster(request: web.Request) -> web.Response:
    c = _console(request)
    snap = c.snapshot or {}
    return _ok({**snap.get("cluster", {}), **c.status()})


async def topics(request: web.Request) -> web.Response:
    c = _console(request)
    rates = c.samples.throughput
    out = []
    for t in (c.snapshot or {}).get("topics", []):
        series = rates.get(t["name"])
        doc = series.series.doc() if series is not None else {"v": []}
        out.append({**t, "records_per_s": doc["v"][-1] if doc["v"] else None})
    return _ok({"topics": out, **c.status()})


async def topic(request: web.Request) -> web.Response:
    c = _console(request)
    name = topic_name(request.match_info["topic"])
    return _ok(await c.blocking(c.source.topic, name))


async def create_topic(request: web.Request) -> web.Response:
    c = _console(request)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequest("the body is not JSON") from None
    req = new_topic_request(body)
    await c.blocking(c.source.create_topic, req)
    log.info("created topic %s (partitions %s, replication factor %s)", req.name,
             req.partitions or "default", req.replication_factor or "default")
    c.wake()
    return web.json_response({"created": req.name}, status=201)


async def groups(request: web.Request) -> web.Response:
    c = _console(request)
    snap = c.snapshot or {}
    return _ok({"groups": snap.get("groups", []), "groups_total": snap.get("groups_total", 0),
                **c.status()})


async def group(request: web.Request) -> web.Response:
    c = _console(request)
    return _ok(await c.blocking(c.source.group, group_id(request.match_info["group"])))


async def throughput(request: web.Request) -> web.Response:
    c = _console(request)
    return _ok({"unit": "records/s", "interval_s": c.interval_s,
                "topics": c.samples.throughput_doc()})


async def lag(request: web.Request) -> web.Response:
    c = _console(request)
    g = group_id(request.match_info["group"])
    doc = c.samples.lag_doc(g)
    return _ok({"group": g, "interval_s": c.interval_s,
                "series": doc if doc is not None else {"t": [], "v": []}})


async def messages(request: web.Request) -> web.Response:
    c = _console(request)
    q = message_query(request.query)
    async with c.browsing:
        return _ok(await c.blocking(c.source.messages, q))


def make_app(console: Console) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_guard])
    app["console"] = console
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/favicon.ico", lambda _r: _no_content())
    app.router.add_get("/api/config", config)
    app.router.add_get("/api/cluster", cluster)
    app.router.add_get("/api/topics", topics)
    app.router.add_post("/api/topics", create_topic)
    app.router.add_get("/api/topics/{topic}", topic)
    app.router.add_get("/api/groups", groups)
    app.router.add_get("/api/groups/{group:.+}", group)
    app.router.add_get("/api/series/throughput", throughput)
    app.router.add_get("/api/series/lag/{group:.+}", lag)
    app.router.add_get("/api/messages", messages)
    return app


# ---------------------------------------------------------------- running


class ListenError(Exception):
    """The console could not listen on the given address."""


async def serve(console: Console, host: str, port: int, stop: asyncio.Event,
                on_listening: Callable[[str], None]) -> None:
    """Serve until ``stop`` is set or the sampler fails (its error is raised)."""
    if console.snapshot is None:  # the tables have data before the URL is printed
        await console.sample_once()
    runner = web.AppRunner(make_app(console), access_log=log if console.verbose else None,
                           handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, shutdown_timeout=3.0, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ListenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    if _loopback(host):
        console.allowed_hosts = {f"{h}:{bound}" for h in ("127.0.0.1", "localhost", "[::1]")}
    shown = f"[{host}]" if ":" in host else host
    on_listening(f"http://{shown}:{bound}/")
    sampler = asyncio.create_task(console.sample_forever(), name="console-sampler")
    stopping = asyncio.create_task(stop.wait())
    error: BaseException | None = None
    try:
        await asyncio.wait({sampler, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if sampler.done():  # only by an error: it samples until cancelled
            error = sampler.exception()
    finally:  # stop sampling, stop serving, leave stuck worker threads behind
        for task in (sampler, stopping):
            task.cancel()
        await asyncio.wait({sampler, stopping}, timeout=5)
        await asyncio.wait_for(runner.cleanup(), 10)
        console.pool.shutdown(wait=False, cancel_futures=True)
    if error is not None:
        raise error
