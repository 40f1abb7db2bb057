"""The admin listener: the plain port's /status, /source-backlog and POST /membership
over mutual TLS, for the group's operator running in another pod.

Clients must present a certificate of the group CA (the handshake refuses any other, or
none). Any such certificate may read; only the operator's (SAN URI
``kdsync-operator://<group>``, ``GroupCa.issue_operator``) may change the membership,
and only with ``allowMembershipChanges: true``, as on the plain port. The listener serves
with the member's own certificate, so the operator can check it reached the member it
meant (``kdsync.admin_client``). Connections still in their TLS handshake are bounded in
number and time (``admin_site``). Every connection or change refused is counted in
``kdsync_admin_connections_refused_total{reason}``.
"""

from __future__ import annotations

import ssl

from aiohttp import web

from kdsync.runtime.admin_site import AdminRefusal, GatedTlsSite, HandshakeLimits
from kdsync.runtime.http_api import add_shared_routes
from kdsync.runtime.sidecar import Sidecar
from kdsync.transport.address import parse_address
from kdsync.transport.identity import (
    MemberTlsFiles,
    is_operator_uri,
    operator_uri,
    parse_member_uri,
)
from kdsync.transport.tls import member_uris_in_peercert


def admin_server_context(files: MemberTlsFiles) -> ssl.SSLContext:
    """Server side: the member's certificate; client certificates of the group CA only."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.verify_mode = ssl.CERT_REQUIRED
    # Only the group CA: the system store would let any publicly trusted client in.
    context.load_verify_locations(cafile=str(files.ca_cert))
    context.load_cert_chain(certfile=str(files.cert), keyfile=str(files.key))
    return context


def operator_refusal(peercert: object, group: str) -> str | None:
    """Why the client with ``peercert`` (verified by the handshake) may not change the
    membership, or None when it is the operator of ``group``."""
    uris = member_uris_in_peercert(peercert)
    presented = ", ".join(uris) or "no URI"
    if any(parse_member_uri(uri) is not None for uri in uris):
        # Also when it names the operator too: a certificate for both is mis-issued.
        return (
            f"membership changes on the admin listener are taken from {operator_uri(group)} "
            f"only; this client's certificate names a member ({presented})"
        )
    if not any(is_operator_uri(uri, group) for uri in uris):
        return (
            f"membership changes on the admin listener are taken from {operator_uri(group)} "
            f"only; this client's certificate names {presented}"
        )
    return None


def build_admin_app(sidecar: Sidecar) -> web.Application:
    group = sidecar.config.group

    def operator_only(request: web.Request) -> str | None:
        transport = request.transport
        peercert = None if transport is None else transport.get_extra_info("peercert")
        refusal = operator_refusal(peercert, group)
        if refusal is not None:
            sidecar.metrics.count_admin_refusal(AdminRefusal.NOT_THE_OPERATOR)
        return refusal

    app = web.Application()
    add_shared_routes(app, sidecar, operator_only, by_flag=False)
    return app


async def start_admin(
    sidecar: Sidecar,
    address: str,
    files: MemberTlsFiles,
    limits: HandshakeLimits | None = None,
) -> web.AppRunner:
    """Serve the admin app on ``address`` over mutual TLS, with ``limits`` on connections
    still in their handshake; the caller cleans the runner up. Raises OSError
    (ssl.SSLError for unusable certificate files) if it cannot."""
    host, port = parse_address(address)
    context = admin_server_context(files)
    runner = web.AppRunner(build_admin_app(sidecar), access_log=None)
    await runner.setup()
    try:
        site = GatedTlsSite(
            runner,
            host,
            port,
            context,
            limits or HandshakeLimits(),
            sidecar.metrics.count_admin_refusal,
        )
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
