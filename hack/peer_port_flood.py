"""Memory of a live TLS peer port under a flood (run through hack/peer-port-flood).

Starts one member's ``TcpTransport`` (mutual TLS, handshake and frame timeouts of 2 s),
then opens ``--slowloris`` connections that announce a TLS ClientHello and stall, plus
``--oversized`` authenticated connections (member c's certificate) that announce a
1 GiB frame. Reports the process's resident memory before, at its peak and after, and
the port's ``kdsync_peer_connections_refused_total{reason}`` as served on a sidecar's
metrics registry. The attackers run in the same process, so the figures are an upper
bound on what the port itself holds; compare runs of different sizes side by side.

  hack/peer-port-flood [--slowloris 500] [--oversized 20]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import resource
import socket
import tempfile
import time
from pathlib import Path

from prometheus_client import generate_latest

from kdsync.pki import make_group_pki
from kdsync.runtime.metrics import SidecarMetrics
from kdsync.transport import TcpTransportConfig
from kdsync.transport.framing import LENGTH_PREFIX, encode_frame
from kdsync.transport.tcp import TcpTransport
from kdsync.transport.tls import client_context

_STALLED_CLIENT_HELLO = b"\x16\x03\x01\x40\x00\x01" + b"\x00" * 100
_HELLO_AS_C = encode_frame(b'{"kdsync":"hello","version":1,"group":"g","member":"c"}')


def rss_mib() -> float:
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * resource.getpagesize() / 2**20


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def flood(slowloris: int, oversized: int) -> None:
    pki = make_group_pki("g", ["a", "b", "c"], Path(tempfile.mkdtemp(prefix="kdsync-flood-")))
    listen = f"127.0.0.1:{free_port()}"
    config = TcpTransportConfig(
        group="g",
        member="a",
        listen=listen,
        peers={"a": listen, "b": "127.0.0.1:9", "c": "127.0.0.1:9"},
        tls=pki["a"],
        handshake_timeout_s=2.0,
        frame_timeout_s=2.0,
        backoff_initial_s=1.0,
        backoff_max_s=5.0,
    )
    metrics = SidecarMetrics()
    transport = TcpTransport(config, registry=metrics.registry)
    await transport.start()
    port = transport.listen_address[1]
    before = rss_mib()
    writers: list[asyncio.StreamWriter] = []
    started = time.monotonic()
    for _ in range(slowloris):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            continue
        writer.write(_STALLED_CLIENT_HELLO)
        writers.append(writer)
    for _ in range(oversized):
        while transport.pending_handshakes >= config.max_pending_handshakes:
            await asyncio.sleep(0.05)
        try:
            _, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=client_context(pki["c"])
            )
        except OSError:
            continue
        writer.write(_HELLO_AS_C + LENGTH_PREFIX.pack(1 << 30) + b"\x00" * 65536)
        writers.append(writer)
    peak = rss_mib()
    while transport.pending_handshakes and time.monotonic() - started < 60:
        await asyncio.sleep(0.1)
        peak = max(peak, rss_mib())
    print(
        f"slowloris={slowloris} oversized={oversized}: RSS before {before:.1f} MiB, "
        f"peak {peak:.1f} MiB, after {rss_mib():.1f} MiB; "
        f"connections still authenticating: {transport.pending_handshakes}"
    )
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith("kdsync_peer_connections_refused_total{") and not line.endswith(" 0.0"):
            print("  " + line)
    for writer in writers:
        writer.transport.abort()
    await transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slowloris", type=int, default=500)
    parser.add_argument("--oversized", type=int, default=20)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = args.slowloris + args.oversized + 256
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))
    logging.disable(logging.WARNING)  # one warning per refused connection otherwise
    asyncio.run(flood(args.slowloris, args.oversized))


if __name__ == "__main__":
    main()
