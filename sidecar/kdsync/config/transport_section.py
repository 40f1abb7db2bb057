"""The ``transport`` section: whether peer links move frames over TCP or RDMA."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kdsync.config.sections import ConfigModel
from kdsync.transport.rdma_config import DEFAULT_BUFFER_BYTES, RdmaSettings


class RdmaConfig(ConfigModel):
    """The RDMA device and buffers of a member whose transport is ``rdma``."""

    device: str | None = Field(
        default=None,
        description="RDMA device, e.g. mlx5_0 or rxe0 (default: the host's only one)",
    )
    port: int = Field(default=1, ge=1, le=255, description="the device's port number")
    gid_index: int | None = Field(
        default=None,
        ge=0,
        description="GID table index (default: the port's first IPv4-mapped GID, RoCE v2)",
    )
    fallback_to_tcp: bool = Field(
        default=False,
        description="without a usable device, run on TCP and say so instead of not starting",
    )
    buffer_bytes: int = Field(
        default=DEFAULT_BUFFER_BYTES,
        ge=4096,
        le=16 * 1024 * 1024,
        description="bytes per registered buffer (one message; larger frames are split)",
    )
    receive_buffers: int = Field(
        default=16, ge=2, le=1024, description="buffers posted per inbound link (its credits)"
    )
    send_buffers: int = Field(
        default=8, ge=1, le=1024, description="send buffers per outbound link"
    )

    def settings(self) -> RdmaSettings:
        return RdmaSettings(
            device=self.device,
            port=self.port,
            gid_index=self.gid_index,
            fallback_to_tcp=self.fallback_to_tcp,
            buffer_bytes=self.buffer_bytes,
            receive_buffers=self.receive_buffers,
            send_buffers=self.send_buffers,
        )


class TransportConfig(ConfigModel):
    """Peer links: always set up over TCP with mutual TLS; with ``type: rdma`` their
    frames then travel over RDMA queue pairs wherever the peer does RDMA too."""

    type: Literal["tcp", "rdma"] = Field(default="tcp", description="tcp or rdma")
    rdma: RdmaConfig = Field(default_factory=RdmaConfig, description="used when type is rdma")
