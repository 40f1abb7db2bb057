"""``python -m tests.support.localnode [--image ARCHIVE]...``: run a node until Ctrl-C.

hack/local-node is the front door (it installs packages, builds binaries and images first).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from tests.support.localnode.node import LocalNode, NodeError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/local-node", description=__doc__)
    parser.add_argument("--image", action="append", default=[], type=Path, metavar="ARCHIVE",
                        help="an image archive to import into containerd (repeatable)")  # fmt: skip
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the node's folder (logs, etcd data) after it stops")  # fmt: skip
    args = parser.parse_args(argv)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())

    def say(text: str) -> None:
        print(f"[local-node] {text}", file=sys.stderr, flush=True)

    node = LocalNode(images=args.image, keep_data=args.keep_data, progress=say)
    try:
        node.start()
    except NodeError as error:
        say(f"error: {error}")
        return 1
    try:
        say(f"node ready in {node.timings['start']:.0f}s; logs in {node.paths.logs}")
        print(f"export KUBECONFIG={node.kubeconfig_path}", flush=True)
        say("Ctrl-C stops the node and removes it")
        stop.wait()
    finally:
        say("stopping")
        node.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
