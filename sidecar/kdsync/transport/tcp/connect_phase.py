"""The TCP handshake of a dial: the one phase of it that gives way to a fresh dial.

On Kubernetes a restarted pod comes back at a new IP. A dial begun while the old IP was
still resolved waits for a TCP handshake that never comes, until the connect timeout
(10 s by default), while the peer, up again, may already have reached us. So while a
dial's TCP handshake is pending, the peer reaching us abandons it, and the dial loop
dials afresh (resolving the name again).

Only the handshake gives way: not the name's resolution before it, nor TLS and the hello
after it. Abandoning takes a *new* authenticated connection from the peer, which shows
that the peer's own dial to us is past its TCP handshake, and a dial that got through
is not made again until its link fails. So two members dialling each other cannot keep
cancelling each other's dials (an earlier change that abandoned whole dials did, over
and over, across a slow link). And a dial always gets ``GIVE_WAY_AFTER_S`` for its
handshake before it gives way: a peer whose links keep failing and coming back cannot
starve a handshake that needs a retransmitted SYN (Linux resends the first after 1 s).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

# How long a dial's TCP handshake may be pending before the peer reaching us abandons it.
GIVE_WAY_AFTER_S = 2.0

# (family, type, proto, canonname, sockaddr), as ``loop.getaddrinfo`` gives them.
AddressInfo = tuple[int, int, int, str, tuple[Any, ...]]
# Turns a host and port into addresses to try, in order. Tests inject one to move a
# peer's name from one address to another, as DNS does for a restarted pod.
Resolver = Callable[[str, int], Awaitable[Sequence[AddressInfo]]]


async def system_resolver(host: str, port: int) -> Sequence[AddressInfo]:
    """The system's resolver for names; an IP address is taken as it is, without the
    thread a lookup takes from the default executor (which Kafka calls keep busy)."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        loop = asyncio.get_running_loop()
        return await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    if ip.version == 4:
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))]
    return [(socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, 0))]


async def open_socket(host: str, addresses: Sequence[AddressInfo]) -> socket.socket:
    """A connected, non-blocking TCP socket to the first of ``host``'s ``addresses``
    that answers. Raises the only failure, or one naming every address's failure."""
    loop = asyncio.get_running_loop()
    failures: list[OSError] = []
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            failures.append(exc)
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    if len(failures) == 1:
        raise failures[0]
    if not failures:
        raise OSError(f"{host} resolved to no address")
    raise OSError(f"every address of {host} failed: " + "; ".join(map(str, failures)))


async def until_woken(
    attempt: Coroutine[Any, Any, T],
    wake: asyncio.Event,
    discard: Callable[[T], None],
    *,
    patience_s: float = 0.0,
) -> T | None:
    """``attempt``'s result, or None when ``wake`` is set first and the attempt does not
    succeed within ``patience_s`` of its start (it is then cancelled if still running;
    an error it ended with no longer matters: the caller tries afresh). An attempt that
    ends first by raising raises here. If this call is cancelled, so is the attempt, and
    a result it had already, or gets while it ends, is released with ``discard`` (e.g. a
    socket closed)."""
    loop = asyncio.get_running_loop()
    give_way_at = loop.time() + patience_s
    trying = asyncio.ensure_future(attempt)
    trying.add_done_callback(_observe)  # however this call ends, no error goes unread
    woken = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({trying, woken}, return_when=asyncio.FIRST_COMPLETED)
        if not trying.done():
            await asyncio.wait({trying}, timeout=max(0.0, give_way_at - loop.time()))
        if not trying.done():
            trying.cancel()
            await asyncio.wait({trying})
    except BaseException:  # this call was cancelled: so is the attempt
        trying.cancel()
        try:
            await asyncio.wait({trying})
        finally:  # even if cancelled again meanwhile
            _release(trying, discard)
        raise
    finally:
        woken.cancel()
    # No await from here on: a result taken is the caller's, and nothing can cancel it.
    if woken.done() and not woken.cancelled() and not _succeeded(trying):
        return None  # woken, and the attempt did not get through in time
    return trying.result()


def _release(trying: asyncio.Future[T], discard: Callable[[T], None]) -> None:
    """Release what ``trying`` got, now or when it ends."""

    def release(task: asyncio.Future[T]) -> None:
        if _succeeded(task):
            discard(task.result())

    if trying.done():
        release(trying)
    else:
        trying.add_done_callback(release)


def _succeeded(task: asyncio.Future[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


def _observe(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
