"""``hack/bench-transport``: the peer transport's throughput and round-trip latency,
TCP and RDMA side by side in one run.

Member "a" (this process) talks to member "b" (a forked child, so each side gets a core)
with mutual TLS. Throughput: a sends a fixed amount of frames of each size; measured
from the first send until b has taken the last one out of ``receive()``. Latency: a
sends one small frame, b answers it, a waits for the answer, many times over; the
figures are those round trips. On RDMA the same TLS links carry only the setup; frames
go over queue pairs (``kdsync.transport.rdma``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path

from kdsync.localkafka.config import allocate_ports
from kdsync.pki import make_group_pki
from kdsync.transport import MemberTlsFiles, TcpTransportConfig
from kdsync.transport.rdma import RdmaTransport
from kdsync.transport.rdma_config import RdmaSettings
from kdsync.transport.tcp import TcpTransport

GROUP = "bench"
PING_BYTES = 64


def _transport(
    kind: str, member: str, peers: dict[str, str], tls: MemberTlsFiles, device: str | None
) -> TcpTransport:
    config = TcpTransportConfig(
        group=GROUP, member=member, listen=peers[member], peers=peers, tls=tls
    )
    if kind == "rdma":
        return RdmaTransport(config, RdmaSettings(device=device))
    return TcpTransport(config)


async def _wait_linked(transport: TcpTransport, kind: str) -> None:
    """Until frames to the peer would travel the way ``kind`` says."""
    deadline = time.monotonic() + 30
    while True:
        peer = transport.peers[0]
        state = transport.peer_states()[peer]
        linked = state.outbound.value == "connected" and state.inbound_connected
        if linked and (
            kind != "rdma"
            or (
                isinstance(transport, RdmaTransport)
                and peer in transport.rdma_outbound
                and peer in transport.rdma_inbound
            )
        ):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the {kind} link did not come up")
        await asyncio.sleep(0.01)


def _receiver(
    kind: str,
    peers: dict[str, str],
    tls: MemberTlsFiles,
    device: str | None,
    counts: list[int],
    pings: int,
    pipe: Connection,
) -> None:
    async def main() -> None:
        async with _transport(kind, "b", peers, tls, device) as transport:
            await _wait_linked(transport, kind)
            pipe.send("ready")
            for _ in range(pings):
                frame = await transport.receive()
                transport.send("a", frame.payload)
            for count in counts:
                for _ in range(count):
                    await transport.receive()
                pipe.send(time.time())
            await asyncio.get_running_loop().run_in_executor(None, pipe.recv)

    asyncio.run(main())


class Figures:
    """One transport's results: round-trip p50/p99 (us), and MB/s per frame size."""

    def __init__(self) -> None:
        self.p50_us = 0.0
        self.p99_us = 0.0
        self.mb_per_s: dict[int, float] = {}


async def _sender(
    kind: str,
    peers: dict[str, str],
    tls: MemberTlsFiles,
    device: str | None,
    sizes: list[int],
    counts: list[int],
    pings: int,
    pipe: Connection,
) -> Figures:
    loop = asyncio.get_running_loop()
    figures = Figures()
    async with _transport(kind, "a", peers, tls, device) as transport:
        await _wait_linked(transport, kind)
        if await loop.run_in_executor(None, pipe.recv) != "ready":
            raise RuntimeError("the receiver did not start")
        round_trips = []
        payload = b"\x5a" * PING_BYTES
        for _ in range(pings):
            started = time.perf_counter()
            transport.send("b", payload)
            await transport.receive()
            round_trips.append((time.perf_counter() - started) * 1e6)
        round_trips.sort()
        figures.p50_us = statistics.median(round_trips)
        figures.p99_us = round_trips[max(0, int(len(round_trips) * 0.99) - 1)]
        for size, count in zip(sizes, counts, strict=True):
            payload = b"\xa5" * size
            started = time.time()
            for _ in range(count):
                while not transport.send("b", payload):
                    await asyncio.sleep(0.0005)  # queue full: let the link drain it
            finished = await loop.run_in_executor(None, pipe.recv)
            figures.mb_per_s[size] = count * size / (finished - started) / 1e6
        pipe.send("done")
    return figures


def run(
    kind: str,
    host: str,
    device: str | None,
    sizes: list[int],
    counts: list[int],
    pings: int,
    pki: dict[str, MemberTlsFiles],
) -> Figures:
    ports = allocate_ports(2, host)
    peers = {"a": f"{host}:{ports[0]}", "b": f"{host}:{ports[1]}"}
    parent_end, child_end = multiprocessing.Pipe()
    receiver = multiprocessing.get_context("fork").Process(
        target=_receiver, args=(kind, peers, pki["b"], device, counts, pings, child_end)
    )
    receiver.start()
    try:
        return asyncio.run(_sender(kind, peers, pki["a"], device, sizes, counts, pings, parent_end))
    finally:
        receiver.join(30)
        if receiver.is_alive():
            receiver.kill()


def main() -> None:
    parser = argparse.ArgumentParser(prog="hack/bench-transport")
    parser.add_argument("--transports", default="tcp", help="tcp, rdma or tcp,rdma")
    parser.add_argument(
        "--sizes", default="1024,65536", help="frame sizes in bytes, comma-separated"
    )
    parser.add_argument("--megabytes", type=int, default=256, help="data to send per frame size")
    parser.add_argument("--pings", type=int, default=2000, help="round trips for the latency")
    parser.add_argument("--host", default="127.0.0.1", help="address both members listen on")
    parser.add_argument("--device", default=None, help="RDMA device (default: the only one)")
    parser.add_argument(
        "--label", default="", help="printed with the results (e.g. what RDMA this is)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # connection attempts before the peer listens
    sizes = [int(size) for size in args.sizes.split(",")]
    counts = [max(1000, args.megabytes * 1024 * 1024 // size) for size in sizes]
    kinds = [kind.strip() for kind in args.transports.split(",") if kind.strip()]
    for kind in kinds:
        if kind not in ("tcp", "rdma"):
            sys.exit(f"hack/bench-transport: unknown transport {kind!r}: use tcp, rdma or tcp,rdma")
    if args.label:
        print(args.label, flush=True)
    with tempfile.TemporaryDirectory(prefix="kdsync-bench-") as tmp:
        pki = make_group_pki(GROUP, ["a", "b"], Path(tmp))
        results = {}
        for kind in kinds:
            print(f"measuring {kind} ...", file=sys.stderr, flush=True)
            results[kind] = run(kind, args.host, args.device, sizes, counts, args.pings, pki)
    print(_table(results, sizes, args.pings, counts))


def _table(results: dict[str, Figures], sizes: list[int], pings: int, counts: list[int]) -> str:
    header = ["transport", f"round trip p50 us ({PING_BYTES} B)", "p99 us"]
    header += [f"MB/s, {size} B frames" for size in sizes]
    rows = [
        [kind, f"{f.p50_us:,.0f}", f"{f.p99_us:,.0f}", *(f"{f.mb_per_s[s]:,.1f}" for s in sizes)]
        for kind, f in results.items()
    ]
    if "tcp" in results and "rdma" in results:
        tcp, rdma = results["tcp"], results["rdma"]
        rows.append(
            [
                "rdma/tcp",
                f"{rdma.p50_us / tcp.p50_us:.2f}x",
                f"{rdma.p99_us / tcp.p99_us:.2f}x",
                *(f"{rdma.mb_per_s[s] / tcp.mb_per_s[s]:.2f}x" for s in sizes),
            ]
        )
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    frames = ", ".join(f"{c} x {s} B" for c, s in zip(counts, sizes, strict=True))
    lines.append(f"({pings} round trips; throughput over {frames}; mutual TLS on every link)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
