"""A toxiproxy server run by this process, and a small client for its HTTP API.

toxiproxy (github.com/Shopify/toxiproxy, built by ``hack/fetch-toxiproxy``) forwards TCP
connections through named proxies; "toxics" added to a proxy delay, throttle or stall the
bytes in one direction (``upstream``: client to server; ``downstream``: back), and a
disabled proxy refuses new connections and closes the open ones. The API is a handful of
JSON calls, so this client is urllib rather than a third-party package.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any

from kdsync.localkafka.config import allocate_ports
from kdsync.localkafka.process import spawn_tied_to_parent

BINARY_ENV = "KDSYNC_TOXIPROXY"


class ToxiproxyError(RuntimeError):
    """The toxiproxy server is missing, did not start, or refused a request."""


def find_binary() -> Path:
    """The server binary: ``$KDSYNC_TOXIPROXY``, else what ``hack/fetch-toxiproxy`` built."""
    explicit = os.environ.get(BINARY_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ToxiproxyError(f"{BINARY_ENV}={explicit} is not a file")
        return path
    cache = Path(os.environ.get("KDSYNC_CACHE", Path.home() / ".cache" / "kdsync"))
    found = sorted((cache / "toxiproxy").glob("*/bin/toxiproxy-server"))
    if not found:
        raise ToxiproxyError(
            f"toxiproxy is not built under {cache / 'toxiproxy'}; run hack/fetch-toxiproxy "
            f"(or set {BINARY_ENV} to a toxiproxy-server binary)"
        )
    return found[-1]


class ToxiproxyServer:
    """One ``toxiproxy-server`` process on a free loopback port, tied to this process."""

    def __init__(self, log_path: Path, binary: Path | None = None) -> None:
        self.binary = binary or find_binary()
        self.log_path = log_path
        self.port = allocate_ports(1)[0]
        self.api = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 30.0) -> ToxiproxyServer:
        self._log = self.log_path.open("ab")
        self._process = spawn_tied_to_parent(
            [str(self.binary), "-host", "127.0.0.1", "-port", str(self.port)],
            log_file=self._log,
            cwd=self.log_path.parent,
            env=dict(os.environ),
        )
        deadline = time.monotonic() + timeout
        while True:
            if self._process.poll() is not None:
                raise ToxiproxyError(f"toxiproxy-server exited; see {self.log_path}")
            try:
                self.request("GET", "/version")
                return self
            except ToxiproxyError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.1)  # polling interval of a condition with a deadline

    def close(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=10)
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> ToxiproxyServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- API -----------------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            raise ToxiproxyError(f"toxiproxy {method} {path}: HTTP {error.code} {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            raise ToxiproxyError(f"toxiproxy {method} {path}: {error}") from None
        try:
            return json.loads(text) if text.strip() else None
        except ValueError:
            return text.decode(errors="replace")  # /version answers in plain text

    def create_proxy(self, name: str, listen: str, upstream: str) -> None:
        self.request(
            "POST",
            "/proxies",
            {"name": name, "listen": listen, "upstream": upstream, "enabled": True},
        )

    def set_upstream(self, name: str, upstream: str) -> None:
        self.request("POST", f"/proxies/{name}", {"upstream": upstream})

    def set_enabled(self, name: str, enabled: bool) -> None:
        self.request("POST", f"/proxies/{name}", {"enabled": enabled})

    def add_toxic(
        self, proxy: str, toxic: str, kind: str, stream: str, attributes: dict[str, int]
    ) -> None:
        """``kind``: latency, bandwidth, timeout, slow_close, limit_data, ...;
        ``stream``: upstream or downstream."""
        self.request(
            "POST",
            f"/proxies/{proxy}/toxics",
            {
                "name": toxic,
                "type": kind,
                "stream": stream,
                "toxicity": 1.0,
                "attributes": attributes,
            },
        )

    def reset(self) -> None:
        """Enable every proxy and remove every toxic."""
        self.request("POST", "/reset")
