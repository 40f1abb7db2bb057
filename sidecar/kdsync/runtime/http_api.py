"""HTTP endpoints of a sidecar: /healthz, /readyz, /metrics (Prometheus), /status (JSON)."""

from __future__ import annotations

import json

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kdsync.runtime.sidecar import Sidecar
from kdsync.transport.address import parse_address


def build_app(sidecar: Sidecar) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        # Alive unless the sidecar failed for good (restarting it is the fix).
        fatal = sidecar.fatal
        if fatal:
            return web.json_response({"ok": False, "error": fatal}, status=503)
        return web.json_response({"ok": True, "phase": sidecar.phase})

    async def readyz(_: web.Request) -> web.Response:
        ready, reasons = sidecar.readiness()
        return web.json_response({"ready": ready, "reasons": reasons}, status=200 if ready else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(sidecar.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def status(_: web.Request) -> web.Response:
        return web.Response(
            text=json.dumps(sidecar.status_document(), indent=2, sort_keys=True),
            content_type="application/json",
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/status", status)
    return app


async def start_http(sidecar: Sidecar, address: str) -> web.AppRunner:
    host, port = parse_address(address)
    runner = web.AppRunner(build_app(sidecar), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
