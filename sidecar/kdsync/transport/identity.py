"""Member identities in certificates, and the PEM files a member presents.

A member's identity is the SAN URI ``kdsync://<group>/<member>`` in its certificate
(``kdsync.transport.tls`` explains the trust model). Pure: certificate makers (the
``kdsync pki`` command, the operator) and config checks use these without loading
``ssl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kdsync.transport.base import validate_member_name

MEMBER_URI_SCHEME = "kdsync"


@dataclass(frozen=True, slots=True)
class MemberTlsFiles:
    """PEM files one member needs: the group CA certificate, its own certificate, its key."""

    ca_cert: Path
    cert: Path
    key: Path


def member_uri(group: str, member: str) -> str:
    """The SAN URI naming ``member`` of ``group``."""
    return f"{MEMBER_URI_SCHEME}://{validate_member_name(group)}/{validate_member_name(member)}"


def parse_member_uri(uri: str) -> tuple[str, str] | None:
    """Return ``(group, member)`` for a well-formed member URI, else None."""
    prefix = f"{MEMBER_URI_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    group, sep, member = uri[len(prefix) :].partition("/")
    if not sep:
        return None
    try:
        validate_member_name(group)
        validate_member_name(member)
    except ValueError:
        return None
    return group, member
