"""``kdsync run``: one sidecar process with its HTTP server, stopped cleanly by SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal

from kdsync.config import SidecarConfig
from kdsync.runtime.http_api import start_http
from kdsync.runtime.sidecar import Sidecar

log = logging.getLogger(__name__)


async def serve(config: SidecarConfig) -> int:
    sidecar = Sidecar(config)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, _on_signal, sidecar, signum)
    try:
        runner = await start_http(sidecar, config.http)
    except OSError as exc:
        log.error(
            "cannot serve HTTP on %s: %s. Fix: choose a free address in `http`", config.http, exc
        )
        return 2
    try:
        return await sidecar.run()
    finally:
        await runner.cleanup()


def _on_signal(sidecar: Sidecar, signum: int) -> None:
    log.info(
        "received %s: finishing the open transaction and stopping", signal.Signals(signum).name
    )
    sidecar.request_stop()


def run(config: SidecarConfig) -> int:
    return asyncio.run(serve(config))
