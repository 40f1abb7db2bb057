"""Member identities in certificates, and the PEM files a member presents.

A member's identity is the SAN URI ``kdsync://<group>/<member>`` in its certificate
(``kdsync.transport.tls`` explains the trust model). The group's operator, which drives
membership changes over a member's admin listener, is ``kdsync-operator://<group>``: a
scheme of its own, so that no operator certificate can ever pass for a member on a peer
link (``parse_member_uri`` takes only ``kdsync://``). Pure: certificate makers (the
``kdsync pki`` command, the operator) and config checks use these without loading
``ssl``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kdsync.transport.base import validate_member_name

MEMBER_URI_SCHEME = "kdsync"
OPERATOR_URI_SCHEME = "kdsync-operator"


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


def operator_uri(group: str) -> str:
    """The SAN URI naming the operator of ``group`` (an admin-listener client, never a peer)."""
    return f"{OPERATOR_URI_SCHEME}://{validate_member_name(group)}"


def is_operator_uri(uri: str, group: str) -> bool:
    """Whether ``uri`` names the operator of ``group`` exactly."""
    try:
        return uri == operator_uri(group)
    except ValueError:  # an invalid group name has no operator
        return False
