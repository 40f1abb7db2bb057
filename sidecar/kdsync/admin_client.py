"""A client of the sidecars' admin listeners (``kdsync.runtime.admin_api``), for the
operator: mutual TLS with the operator's certificate, JSON in and out.

Standard library only (``http.client`` and ``ssl``) and the transport's pure identity
modules, outside ``kdsync.runtime``, so the operator can import it without aiohttp or
the Kafka client (the ``admin-client-light`` contract in pyproject.toml keeps it so).

The server's chain is checked against the group CA; host names are not (member
certificates carry only a SAN URI), the member is: right after the handshake, before
anything is sent, the certificate must name the member the caller meant, so a stale or
wrong address cannot send a membership change elsewhere.
"""

from __future__ import annotations

import http.client
import json
import os
import ssl
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Any

from kdsync.transport.address import parse_address
from kdsync.transport.base import validate_member_name
from kdsync.transport.identity import member_uri, parse_member_uri


class AdminUnreachable(OSError):
    """The admin listener could not be reached or did not answer (connection refused,
    timeout, TLS handshake refused, connection dropped); the message names host:port."""


class AdminIdentityMismatch(Exception):
    """The server at the address is a member of the group CA, but not the one meant."""


class AdminClient:
    """Talks to the admin listeners of one group's members as its operator.

    ``ca_pem`` is the group CA certificate, ``cert_pem`` and ``key_pem`` the operator's
    (``GroupCa.issue_operator``). The key is on disk only while the TLS context loads it
    (``ssl`` reads keys from files only): in a private temporary folder, mode 0600,
    removed before the constructor returns. ``close()`` (or leaving a ``with`` block)
    drops the loaded context; the client cannot be used after it.
    """

    def __init__(self, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, group: str) -> None:
        self.group = validate_member_name(group)
        self._context: ssl.SSLContext | None = _client_context(ca_pem, cert_pem, key_pem)

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._context = None

    def get_json(
        self, host_port: str, path: str, member: str, timeout: float
    ) -> tuple[int, dict[str, Any]]:
        """GET ``path`` from ``member``'s admin listener at ``host_port``: (status, answer)."""
        return self._exchange("GET", host_port, path, member, None, timeout)

    def post_json(
        self, host_port: str, path: str, member: str, body: dict[str, Any], timeout: float
    ) -> tuple[int, dict[str, Any]]:
        """POST ``body`` as JSON to ``path`` of ``member``'s admin listener: (status, answer).

        A non-2xx status is an answer, not an exception (``{"outcome", "reason"}`` for
        the sidecar's refusals). Raises AdminUnreachable or AdminIdentityMismatch.
        """
        return self._exchange("POST", host_port, path, member, json.dumps(body).encode(), timeout)

    def _exchange(
        self,
        method: str,
        host_port: str,
        path: str,
        member: str,
        body: bytes | None,
        timeout: float,
    ) -> tuple[int, dict[str, Any]]:
        if self._context is None:
            raise ValueError("this AdminClient is closed")
        if not path.startswith("/"):
            raise ValueError(f"path {path!r} must start with /")
        expected = member_uri(self.group, member)  # ValueError for a bad name, before I/O
        host, port = parse_address(host_port)
        connection = http.client.HTTPSConnection(host, port, timeout=timeout, context=self._context)
        try:
            try:
                connection.connect()
            except OSError as exc:
                raise AdminUnreachable(
                    f"cannot reach the admin listener of {member} at {host_port}: {exc}"
                ) from exc
            _check_server(connection.sock, host_port, expected)
            # One connection per request: the server need not keep it alive for us.
            headers = {"Connection": "close"}
            if body is not None:
                headers["Content-Type"] = "application/json"
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                raw = response.read()
            except (OSError, http.client.HTTPException) as exc:
                # With TLS 1.3 a refused client certificate shows here, not in connect().
                raise AdminUnreachable(
                    f"the admin listener of {member} at {host_port} did not answer "
                    f"{method} {path}: {exc!r}"
                ) from exc
        finally:
            connection.close()
        return response.status, _answer(raw)


def _client_context(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    # The member's SAN URI is checked instead (_check_server); certificates carry no host.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    try:
        # Only the group CA: not the system store.
        context.load_verify_locations(cadata=ca_pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError) as exc:
        raise ValueError(f"the group CA is not a PEM certificate: {exc}") from exc
    with tempfile.TemporaryDirectory(prefix="kdsync-admin-") as folder:  # mode 0700
        cert_path = Path(folder) / "cert.pem"
        key_path = Path(folder) / "key.pem"
        _write_private(cert_path, cert_pem)
        _write_private(key_path, key_pem)
        try:
            context.load_cert_chain(certfile=cert_path, keyfile=key_path)
        except ssl.SSLError as exc:
            raise ValueError(
                f"the operator's certificate and key are not a matching PEM pair: {exc}"
            ) from exc
    return context


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _check_server(sock: object, host_port: str, expected: str) -> None:
    """Raise AdminIdentityMismatch unless the verified server certificate names exactly
    the member ``expected`` (URIs of other schemes, e.g. SPIFFE, are ignored)."""
    peercert = sock.getpeercert() if isinstance(sock, ssl.SSLSocket) else None
    alt_names = peercert.get("subjectAltName", ()) if peercert else ()
    named = [
        entry[1]
        for entry in alt_names
        if isinstance(entry, tuple)
        and entry[0] == "URI"
        and isinstance(entry[1], str)
        and parse_member_uri(entry[1]) is not None
    ]
    if named != [expected]:
        raise AdminIdentityMismatch(
            f"the admin listener at {host_port} presented a certificate for "
            f"{', '.join(named) or 'no kdsync member'}, not {expected}: that address does "
            "not lead to the member meant (a stale address, or a misrouted Service?)"
        )


def _answer(raw: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(raw)
    except ValueError:
        return {"reason": raw.decode("utf-8", "replace")[:1000]}
    return answer if isinstance(answer, dict) else {"reason": str(answer)}
