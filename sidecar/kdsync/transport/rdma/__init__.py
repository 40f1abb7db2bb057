"""Peer transport over RDMA queue pairs, set up over the TCP transport's TLS links.

Modules: ``links`` (``RdmaTransport``: setting up a link's queue pairs and moving its
frames), ``stream`` (cutting frames into messages, credits, reassembly: no I/O),
``verbs`` (the interface to a device) and ``pyverbs_device`` (that interface on a real
device, with pyverbs, imported only when RDMA is used).
"""

from kdsync.transport.rdma.links import RdmaTransport
from kdsync.transport.rdma.verbs import RdmaUnavailable

__all__ = ["RdmaTransport", "RdmaUnavailable"]
