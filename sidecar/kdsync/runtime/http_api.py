"""HTTP endpoints of a sidecar: /healthz, /readyz, /metrics (Prometheus), /status (JSON),
``/source-backlog``, and ``POST /membership`` (``kdsync members``: remove a member, add a
witness), which only this host may call here. The last three are shared with the admin
listener (``kdsync.runtime.admin_api``), which takes /membership from the operator."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Callable

from aiohttp import web
from confluent_kafka import KafkaException
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kdsync.driver.membership_request import Outcome, add_member, remove_member
from kdsync.runtime.sidecar import Sidecar
from kdsync.transport.address import parse_address
from kdsync.transport.base import validate_member_name

# Why a caller may not change the membership (the 403 reason), or None if it may.
CallerCheck = Callable[[web.Request], str | None]


def build_app(sidecar: Sidecar) -> web.Application:
    """The plain port: health, metrics, and the shared routes with /membership from
    loopback only (``kdsync.runtime.admin_api`` serves them with authentication)."""

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

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    add_shared_routes(app, sidecar, _loopback_caller)
    return app


def _loopback_caller(request: web.Request) -> str | None:
    # The plain port also serves /metrics, which is scraped from elsewhere: only this
    # host may change the membership through it.
    if _from_this_host(request.remote):
        return None
    return (
        f"membership changes are taken from this host only, not {request.remote}: "
        "run kdsync members on the member's host"
    )


def add_shared_routes(
    app: web.Application, sidecar: Sidecar, caller_check: CallerCheck, *, by_flag: bool = True
) -> None:
    """GET /status, GET /source-backlog and POST /membership, the same on the plain port
    and on the admin listener; ``caller_check`` says who may change the membership, and
    ``by_flag`` whether ``allowMembershipChanges`` must be on too (the plain port: the
    admin listener is the opt-in itself, and only the operator's certificate passes)."""

    async def status(_: web.Request) -> web.Response:
        return web.Response(
            text=json.dumps(sidecar.status_document(), indent=2, sort_keys=True),
            content_type="application/json",
        )

    async def membership(request: web.Request) -> web.Response:
        # Off unless the config turns it on; then only from the callers ``caller_check``
        # lets through. The JSON content type keeps a browser on this host from posting
        # it from another site's page.
        if by_flag and not sidecar.config.allow_membership_changes:
            return error_response(
                403,
                "membership changes are off for this sidecar: set allowMembershipChanges: "
                "true in its config to take them",
            )
        refusal = caller_check(request)
        if refusal is not None:
            return error_response(403, refusal)
        if request.content_type != "application/json":
            return error_response(415, "send the request as Content-Type: application/json")
        try:
            body = await request.json()
        except ValueError:
            body = None
        request_or_problem = _membership_request(body)
        if isinstance(request_or_problem, web.Response):
            return request_or_problem
        change, name, address, witness = request_or_problem
        driver = sidecar.driver
        if driver is None or sidecar.phase != "running":
            return web.json_response(
                {"outcome": Outcome.ASK_AGAIN.value, "reason": f"this member is {sidecar.phase}"},
                status=503,
            )
        if change == "remove":
            answer = remove_member(driver, name)
        else:
            assert address is not None
            answer = add_member(driver, name, address, witness=witness)
        return web.json_response(answer.as_json(driver), status=_STATUS[answer.outcome])

    async def source_backlog(_: web.Request) -> web.Response:
        # For `kdsync members remove`'s drain: asks the brokers, so it is not in /status.
        if sidecar.phase != "running":
            return web.json_response({"reason": f"this member is {sidecar.phase}"}, status=503)
        try:
            backlog = await sidecar.source_backlog()
        except LookupError as exc:
            return web.json_response({"reason": str(exc)}, status=404)
        except KafkaException as exc:
            reason = f"its Kafka cluster did not answer: {exc}"
            return web.json_response({"reason": reason}, status=503)
        return web.json_response({"backlog": backlog})

    app.router.add_get("/status", status)
    app.router.add_get("/source-backlog", source_backlog)
    app.router.add_post("/membership", membership)


_BODIES = (
    '{"remove": "<member>"} or {"add": "<member>", "witness": true|false, "peer": "<host:port>"}'
)


def _membership_request(body: object) -> tuple[str, str, str | None, bool] | web.Response:
    """(change, member, peer address, witness) from a request body, or the error to answer."""
    if not isinstance(body, dict) or len({"add", "remove"} & set(body)) != 1:
        return error_response(400, f"expected a JSON body {_BODIES}")
    change = "add" if "add" in body else "remove"
    name = body[change]
    if not isinstance(name, str) or not name:
        return error_response(400, f"{change!r} must name a member: {_BODIES}")
    if change == "remove":
        return change, name, None, False
    try:
        validate_member_name(name)
    except ValueError as exc:
        return error_response(400, f"{name!r} cannot be a member's name: {exc}")
    witness = body.get("witness")
    if not isinstance(witness, bool):
        return error_response(
            400,
            f'say whether {name} is a witness: "witness": true, or false for a data member '
            "(whose T-global a backfill seeds: kdsync members add without --witness does it)",
        )
    address = body.get("peer")
    if not isinstance(address, str):
        return error_response(400, f"'peer' must be the host:port the other members dial {name} at")
    try:
        parse_address(address)
    except ValueError as exc:
        return error_response(400, f"'peer' {address!r} is not a usable host:port: {exc}")
    return change, name, address, witness


_STATUS = {
    Outcome.APPENDED: 200,
    Outcome.ALREADY_A_MEMBER: 200,
    Outcome.ASK_AGAIN: 409,
    Outcome.NOT_A_MEMBER: 404,
    Outcome.REFUSED: 422,
}


def _from_this_host(remote: str | None) -> bool:
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return False  # a Unix socket or an unparsable peer: not known to be local
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # ::ffff:127.0.0.1 on a dual-stack socket
    return address.is_loopback


def error_response(status: int, message: str) -> web.Response:
    """A refusal as JSON: ``{"outcome": "refused", "reason": message}``."""
    return web.json_response({"outcome": Outcome.REFUSED.value, "reason": message}, status=status)


async def start_http(sidecar: Sidecar, address: str) -> web.AppRunner:
    host, port = parse_address(address)
    runner = web.AppRunner(build_app(sidecar), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner
