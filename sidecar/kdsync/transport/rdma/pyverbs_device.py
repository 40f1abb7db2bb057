"""The verbs port on a real device, with pyverbs (rdma-core's Python bindings).

pyverbs is not on PyPI for this Python, and it comes with rdma-core (Debian:
``python3-pyverbs``), so it is imported only here, only when RDMA is configured, and
typed as ``Any``. Two versions are in use: rdma-core 59 and later keep the enums in
``pyverbs.libibverbs_enums``, earlier ones (Debian 12 ships 44) in ``pyverbs.enums``;
and only rdma-core 56 and later expose a completion channel's descriptor, so on older
ones it is found in ``/proc/self/fd`` right after the channel is made.
"""

from __future__ import annotations

import contextlib
import os
import random
import resource
from pathlib import Path
from typing import Any

from kdsync.transport.rdma.verbs import Completion, QueuePairInfo, RdmaLinkError, RdmaUnavailable

# Queue pair attributes: ~67 ms ack timeout (4.096 us * 2**14), 7 retries; an
# unresponsive peer fails the queue pair in about half a second. Receiver-not-ready
# cannot happen (credits), so its retry count only guards a bug.
_ACK_TIMEOUT = 14
_RETRIES = 7
_MIN_RNR_TIMER = 12
_HOP_LIMIT = 64
_IPV4_MAPPED_GID_PREFIX = "0000:0000:0000:0000:0000:ffff:"
_CHANNEL_LINK = "anon_inode:[infinibandevent]"


def _pyverbs() -> tuple[Any, Any]:
    """(pyverbs' modules as one namespace, its enums module)."""
    # Imported here, not at the top: only a member configured for RDMA needs pyverbs.
    try:
        import pyverbs.addr  # noqa: PLC0415
        import pyverbs.cq  # noqa: PLC0415
        import pyverbs.device  # noqa: PLC0415
        import pyverbs.mr  # noqa: PLC0415
        import pyverbs.pd  # noqa: PLC0415
        import pyverbs.qp  # noqa: PLC0415
        import pyverbs.wr  # noqa: PLC0415
    except ImportError as exc:
        raise RdmaUnavailable(
            f"pyverbs is not importable ({exc}): install rdma-core's Python bindings "
            "(Debian/Ubuntu: apt-get install python3-pyverbs), or set transport.type: tcp"
        ) from exc
    try:
        import pyverbs.libibverbs_enums as enums  # noqa: PLC0415 (rdma-core 59 and later)
    except ImportError:
        from pyverbs import enums  # noqa: PLC0415 (earlier rdma-core, e.g. Debian 12's 44)
    return pyverbs, enums


def device_names() -> list[str]:
    """The RDMA devices the kernel offers (``/sys/class/infiniband``)."""
    root = Path("/sys/class/infiniband")
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


class PyverbsDevice:
    """``VerbsDevice`` on one port of a real device (``device=None``: the only one)."""

    def __init__(self, device: str | None, port: int, gid_index: int | None) -> None:
        names = device_names()
        if not names:
            raise RdmaUnavailable(
                "no RDMA device: /sys/class/infiniband is empty or missing. Give the pod an "
                "RDMA device (the SR-IOV device plugin resource of transport.rdma), load the "
                "NIC's RDMA driver, or for a test host add Soft-RoCE (modprobe rdma_rxe; rdma "
                "link add rxe0 type rxe netdev eth0); or set transport.type: tcp"
            )
        if device is None:
            if len(names) > 1:
                raise RdmaUnavailable(
                    f"several RDMA devices ({', '.join(names)}): name one in transport.rdma.device"
                )
            device = names[0]
        elif device not in names:
            raise RdmaUnavailable(
                f"RDMA device {device!r} not found; this host has {', '.join(names)}: fix "
                "transport.rdma.device"
            )
        self._v, self._e = _pyverbs()
        self.name = device
        self.port = port
        try:
            self._context = self._v.device.Context(name=device)
            port_attr = self._context.query_port(port)
        except Exception as exc:
            raise RdmaUnavailable(f"cannot open RDMA device {device} port {port}: {exc}") from exc
        if port_attr.state != self._e.IBV_PORT_ACTIVE:
            raise RdmaUnavailable(
                f"RDMA device {device} port {port} is not active (state {port_attr.state}): "
                "check its link (rdma link show)"
            )
        self.mtu = int(port_attr.active_mtu)
        self.gid_index = self._choose_gid(port_attr.gid_tbl_len, gid_index)
        self.gid = str(self._context.query_gid(port, self.gid_index))
        self._pd = self._v.pd.PD(self._context)

    def _choose_gid(self, table_length: int, configured: int | None) -> int:
        """The configured GID index, else the first IPv4-mapped GID (RoCE v2 over IPv4,
        routable between hosts), else the first non-zero one."""
        if configured is not None:
            if not 0 <= configured < table_length:
                raise RdmaUnavailable(
                    f"transport.rdma.gidIndex {configured} is outside the port's GID table "
                    f"(0..{table_length - 1})"
                )
            return configured
        first: int | None = None
        for index in range(table_length):
            try:
                gid = str(self._context.query_gid(self.port, index))
            except Exception:
                continue
            if gid.startswith(_IPV4_MAPPED_GID_PREFIX):
                return index
            if first is None and gid.strip("0:"):
                first = index
        if first is None:
            raise RdmaUnavailable(
                f"RDMA device {self.name} port {self.port} has no GID: give its network "
                "device an IP address"
            )
        return first

    @property
    def description(self) -> str:
        return f"{self.name} port {self.port}, GID {self.gid} (index {self.gid_index})"

    def link(self, slots: int, buffer_bytes: int) -> PyverbsLink:
        try:
            return PyverbsLink(self, slots, buffer_bytes)
        except RdmaUnavailable:
            raise
        except Exception as exc:
            raise RdmaUnavailable(
                f"cannot set up a queue pair on {self.name}: {exc}{_memlock_hint(exc)}"
            ) from exc

    def close(self) -> None:
        self._pd.close()
        self._context.close()


class PyverbsLink:
    """``VerbsLink``: one RC queue pair with its own completion queue and channel."""

    def __init__(self, device: PyverbsDevice, slots: int, buffer_bytes: int) -> None:
        v, e = device._v, device._e
        self._v, self._e, self._device = v, e, device
        self._buffer_bytes = buffer_bytes
        before = _channel_descriptors()
        self._channel = v.cq.CompChannel(device._context)
        fd = getattr(self._channel, "fd", None)
        if fd is None:
            new = _channel_descriptors() - before
            if len(new) != 1:
                raise RdmaUnavailable("cannot find the completion channel's descriptor")
            fd = new.pop()
        self._fd = int(fd)
        os.set_blocking(self._fd, False)  # get_cq_event must not wait on the event loop
        self._cq = v.cq.CQ(device._context, 2 * slots + 2, None, self._channel, 0)
        self._cq.req_notify()
        self._mr = v.mr.MR(device._pd, slots * buffer_bytes, e.IBV_ACCESS_LOCAL_WRITE)
        self._sges = [
            v.wr.SGE(self._mr.buf + slot * buffer_bytes, buffer_bytes, self._mr.lkey)
            for slot in range(slots)
        ]
        cap = v.qp.QPCap(max_send_wr=slots, max_recv_wr=slots, max_send_sge=1, max_recv_sge=1)
        init = v.qp.QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self._cq, rcq=self._cq, cap=cap)
        self._qp = v.qp.QP(device._pd, init)
        self._info = QueuePairInfo(
            qpn=int(self._qp.qp_num),
            psn=random.randrange(2**24),
            gid=device.gid,
            mtu=device.mtu,
        )

    @property
    def info(self) -> QueuePairInfo:
        return self._info

    def connect(self, remote: QueuePairInfo) -> None:
        v, device = self._v, self._device
        attr = v.qp.QPAttr(port_num=device.port)
        attr.qp_access_flags = 0  # send/receive only: no remote access to this memory
        attr.path_mtu = min(device.mtu, remote.mtu)
        attr.dest_qp_num = remote.qpn
        attr.rq_psn = remote.psn
        attr.sq_psn = self._info.psn
        attr.max_dest_rd_atomic = 1
        attr.max_rd_atomic = 1
        attr.min_rnr_timer = _MIN_RNR_TIMER
        attr.timeout = _ACK_TIMEOUT
        attr.retry_cnt = _RETRIES
        attr.rnr_retry = _RETRIES
        route = v.addr.GlobalRoute(
            dgid=v.addr.GID(remote.gid), sgid_index=device.gid_index, hop_limit=_HOP_LIMIT
        )
        attr.ah_attr = v.addr.AHAttr(gr=route, is_global=1, port_num=device.port)
        try:
            self._qp.to_rts(attr)
        except Exception as exc:
            raise RdmaLinkError(f"connecting the queue pair to {remote}: {exc}") from exc

    def fileno(self) -> int:
        return self._fd

    def completions(self) -> list[Completion]:
        try:
            self._channel.get_cq_event(self._cq)
        except Exception:  # no event waiting (the descriptor is non-blocking)
            pass
        else:
            self._cq.ack_events(1)
        self._cq.req_notify()
        done: list[Completion] = []
        success = self._e.IBV_WC_SUCCESS
        while True:
            count, entries = self._cq.poll(64)
            for wc in entries:
                error = None if wc.status == success else f"work completion status {wc.status}"
                done.append(Completion(int(wc.wr_id), int(wc.byte_len), error))
            if count < 64:
                return done

    def post_receive(self, slot: int) -> None:
        try:
            self._qp.post_recv(self._v.wr.RecvWR(wr_id=slot, num_sge=1, sg=[self._sges[slot]]))
        except Exception as exc:
            raise RdmaLinkError(f"posting a receive: {exc}") from exc

    def post_send(self, slot: int, message: bytes) -> None:
        self._mr.write(message, len(message), slot * self._buffer_bytes)
        sge = self._v.wr.SGE(self._mr.buf + slot * self._buffer_bytes, len(message), self._mr.lkey)
        try:
            self._qp.post_send(self._v.wr.SendWR(wr_id=slot, num_sge=1, sg=[sge]))
        except Exception as exc:
            raise RdmaLinkError(f"posting a send: {exc}") from exc

    def read(self, slot: int, length: int) -> bytes:
        data: bytes = self._mr.read(length, slot * self._buffer_bytes)
        return data

    def close(self) -> None:
        for resource_ in (self._qp, self._mr, self._cq, self._channel):
            # Closing after the device failed: nothing more to free.
            with contextlib.suppress(Exception):
                resource_.close()


def _channel_descriptors() -> set[int]:
    found: set[int] = set()
    for entry in Path("/proc/self/fd").iterdir():
        try:
            if os.readlink(entry) == _CHANNEL_LINK:
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _memlock_hint(exc: Exception) -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if "12" not in str(exc) and "memory" not in str(exc).lower():
        return ""
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
    return (
        f" (registering memory failed; the locked-memory limit is {limit}: raise "
        "RLIMIT_MEMLOCK, or give the container the IPC_LOCK capability; docs/sidecar.md, "
        '"RDMA")'
    )
