"""What every encoding shares: the format version, the type tags, and the errors.

``decode`` checks the version and tag in front of every encoding, dispatches to a
body decoder and turns whatever a body decoder trips over (a short read, bad UTF-8, a
bad flag or length) into one ``WireFormatError`` naming what was being decoded. The
layout of each body is in ``kdsync.wire_format``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import TypeVar

FORMAT_VERSION = 1

TAG_VOTE_REQUEST = 1
TAG_VOTE_REPLY = 2
TAG_APPEND = 3
TAG_APPEND_REPLY = 4
TAG_FORWARD = 5
TAG_TIMEOUT_NOW = 6
TAG_RECOVER_REQUEST = 7
TAG_RECOVER_REPLY = 8
TAG_PRE_VOTE_REQUEST = 9
TAG_PRE_VOTE_REPLY = 10
# Parts of a recovery answer too large for one message; the whole-answer forms (7, 8)
# stay as they were, so members of the previous release still recover each other.
TAG_RECOVER_REQUEST_AFTER = 11
TAG_RECOVER_REPLY_PART = 12
TAG_ENTRY = 16
TAG_HARD_STATE = 17
TAG_LEDGER_STATE = 18

_TAG_NAMES: dict[int, str] = {
    TAG_VOTE_REQUEST: "VoteRequest message",
    TAG_VOTE_REPLY: "VoteReply message",
    TAG_APPEND: "Append message",
    TAG_APPEND_REPLY: "AppendReply message",
    TAG_FORWARD: "Forward message",
    TAG_TIMEOUT_NOW: "TimeoutNow message",
    TAG_RECOVER_REQUEST: "RecoverRequest message",
    TAG_RECOVER_REPLY: "RecoverReply message",
    TAG_PRE_VOTE_REQUEST: "PreVoteRequest message",
    TAG_PRE_VOTE_REPLY: "PreVoteReply message",
    TAG_RECOVER_REQUEST_AFTER: "RecoverRequest (continued) message",
    TAG_RECOVER_REPLY_PART: "RecoverReply (part) message",
    TAG_ENTRY: "Entry record",
    TAG_HARD_STATE: "HardState record",
    TAG_LEDGER_STATE: "LedgerState record",
}

PREFIX = struct.Struct(">BB")

_T = TypeVar("_T")


class WireFormatError(ValueError):
    """Bytes that are not a valid encoding (truncated, corrupt, unknown version or type),
    or a value that this format cannot represent."""


def encode_error(what: str, exc: Exception) -> WireFormatError:
    if isinstance(exc, UnicodeEncodeError):
        return WireFormatError(f"cannot encode {what}: a name is not valid Unicode ({exc})")
    # struct.error: a field out of its range (an int64 field beyond 2**63, a partition
    # beyond int32, a value of 2 GiB or more) or of the wrong type.
    return WireFormatError(f"cannot encode {what}: {exc}")


def bad_flag(what: str, value: int) -> WireFormatError:
    return WireFormatError(f"{what} must be 0 or 1, got {value}")


def bad_length(what: str, value: int) -> WireFormatError:
    return WireFormatError(f"{what} length must be >= -1, got {value}")


def _a(name: str) -> str:
    return f"an {name}" if name[0] in "AEIOU" else f"a {name}"


def decode(
    data: bytes | bytearray | memoryview,
    decoders: Mapping[int, Callable[[bytes], tuple[_T, int]]],
    expected: str,
) -> _T:
    if not isinstance(data, bytes):
        # Slices of a memoryview or bytearray would not be the bytes the events hold.
        data = bytes(data)
    if len(data) < PREFIX.size:
        raise WireFormatError(f"{len(data)} byte(s) is too short for {_a(expected)}")
    version, tag = PREFIX.unpack_from(data)
    if version != FORMAT_VERSION:
        raise WireFormatError(
            f"unsupported wire format version {version} (this kdsync reads version "
            f"{FORMAT_VERSION}); is a peer or a stored record from another kdsync release?"
        )
    decoder = decoders.get(tag)
    if decoder is None:
        known = _TAG_NAMES.get(tag)
        if known is not None:
            raise WireFormatError(f"expected {_a(expected)}, got {_a(known)} (type tag {tag})")
        raise WireFormatError(f"unknown type tag {tag} for {_a(expected)}")
    what = _TAG_NAMES[tag]
    try:
        value, pos = decoder(data)
    except struct.error as exc:
        raise WireFormatError(f"truncated {what} ({len(data)} bytes): {exc}") from exc
    except UnicodeDecodeError as exc:
        raise WireFormatError(f"invalid UTF-8 in a name in {_a(what)}: {exc}") from exc
    except WireFormatError as exc:
        raise WireFormatError(f"malformed {what}: {exc}") from exc
    if pos != len(data):
        if pos > len(data):
            raise WireFormatError(
                f"truncated {what}: a length field runs to byte {pos} "
                f"but the input has {len(data)} bytes"
            )
        raise WireFormatError(f"{len(data) - pos} unexpected byte(s) after {_a(what)}")
    return value
