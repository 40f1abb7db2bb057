"""A real single-node Kubernetes cluster in a network namespace (see :mod:`.node`)."""

from tests.support.localnode.node import LocalNode, NodeError, reap_stale_nodes

__all__ = ["LocalNode", "NodeError", "reap_stale_nodes"]
