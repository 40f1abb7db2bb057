"""A real Kubernetes control plane for tests: etcd + kube-apiserver, envtest style.

There is no kubelet, scheduler or controller-manager: objects are stored and validated
(OpenAPI schemas, CEL rules, RBAC, admission) exactly as in a cluster, but pods never run
and nothing garbage-collects; tests set status through the API themselves.

The binaries come from ``hack/fetch-k8s`` (built from the Go module proxy). Typical use::

    with LocalControlPlane() as cp:
        cp.kubectl("apply", "-f", "crds/")
        client = kubernetes.config.new_client_from_config(str(cp.kubeconfig_path))

Certificates (a throwaway CA, the API server's serving certificate for 127.0.0.1 and an
admin client certificate in group ``system:masters``) are made with the ``openssl`` tool.
Every process gets ``PR_SET_PDEATHSIG`` so it dies with the Python process that started
it, even if that process is killed without running ``stop()``.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import yaml

__all__ = [
    "BinariesMissingError",
    "ControlPlaneError",
    "K8sBinaries",
    "KubectlError",
    "LocalControlPlane",
    "find_binaries",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = REPO_ROOT / "hack" / "fetch-k8s"
RUN_DIR_PREFIX = "kdsync-envtest-"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
ADMIN_USER = "kdsync-admin"
# How many times to retry with fresh ports when another process grabbed ours in between.
_PORT_ATTEMPTS = 3
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """The control plane could not be started or used."""


class BinariesMissingError(ControlPlaneError):
    """kube-apiserver, etcd or kubectl is not built yet."""


class _PortTakenError(ControlPlaneError):
    """A process could not bind the port we picked; start again with fresh ports."""


class KubectlError(ControlPlaneError):
    """A kubectl (or helm) command exited with a non-zero status."""

    def __init__(self, args: Sequence[str], returncode: int, stdout: str, stderr: str) -> None:
        self.args_used = list(args)
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        shown = " ".join(args)
        super().__init__(f"`{shown}` exited with {returncode}:\n{stderr.strip() or stdout.strip()}")


# --- locating the binaries ----------------------------------------------------------------


@dataclass(frozen=True)
class K8sBinaries:
    """Paths of the binaries built by ``hack/fetch-k8s``."""

    bin_dir: Path

    @property
    def kube_apiserver(self) -> Path:
        return self.bin_dir / "kube-apiserver"

    @property
    def etcd(self) -> Path:
        return self.bin_dir / "etcd"

    @property
    def kubectl(self) -> Path:
        return self.bin_dir / "kubectl"

    @property
    def helm(self) -> Path:
        return self.bin_dir / "helm"

    def require(self, *names: str) -> None:
        """Raises BinariesMissingError unless every named binary is executable."""
        missing = [n for n in names if not os.access(self.bin_dir / n, os.X_OK)]
        if missing:
            raise BinariesMissingError(
                f"missing {', '.join(missing)} in {self.bin_dir}: run hack/fetch-k8s "
                "(builds them from the Go module proxy; the first build takes a while), "
                "or point KDSYNC_K8S_BIN at a folder holding them"
            )


def pinned_k8s_version() -> str:
    """The Kubernetes version hack/fetch-k8s builds (KDSYNC_K8S_VERSION overrides it)."""
    override = os.environ.get("KDSYNC_K8S_VERSION")
    if override:
        return override
    try:
        script = FETCH_SCRIPT.read_text(encoding="utf-8")
    except OSError as exc:
        raise BinariesMissingError(
            f"cannot read {FETCH_SCRIPT} to find the pinned version"
        ) from exc
    match = re.search(r'K8S_VERSION="\$\{KDSYNC_K8S_VERSION:-(v[0-9.]+)\}"', script)
    if match is None:
        raise BinariesMissingError(f"no K8S_VERSION pin found in {FETCH_SCRIPT}")
    return match.group(1)


def default_bin_dir() -> Path:
    """``$KDSYNC_K8S_BIN``, else ``$KDSYNC_CACHE/k8s/<version>/bin`` as hack/fetch-k8s makes."""
    explicit = os.environ.get("KDSYNC_K8S_BIN")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("KDSYNC_CACHE") or Path.home() / ".cache" / "kdsync")
    return cache / "k8s" / pinned_k8s_version() / "bin"


def find_binaries(bin_dir: Path | None = None) -> K8sBinaries:
    """The control-plane binaries, checked to exist (helm is checked only when used)."""
    binaries = K8sBinaries(bin_dir if bin_dir is not None else default_bin_dir())
    binaries.require("etcd", "kube-apiserver", "kubectl")
    return binaries


# --- processes ----------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A preexec_fn: the child gets SIGKILL when the process that started it exits."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died between fork() and prctl(): then nobody would kill us.
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def _free_ports(count: int) -> list[int]:
    """Distinct loopback ports that were free a moment ago (all held open while choosing)."""
    with contextlib.ExitStack() as stack:
        ports: list[int] = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def _tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def stop(self, grace: float) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                self.proc.wait(timeout=30)
        self.log_file.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _reap_stale_run_dirs(tmp_root: Path) -> None:
    """Removes run folders of control planes whose owning process has gone, killing any of
    their processes that survived (only if /proc still shows them running from that folder)."""
    for run_dir in tmp_root.glob(RUN_DIR_PREFIX + "*"):
        try:
            owner = int((run_dir / "owner.pid").read_text())
        except (OSError, ValueError):
            continue
        if _pid_alive(owner):
            continue
        for pid_file in run_dir.glob("*.pid"):
            if pid_file.name == "owner.pid":
                continue
            try:
                pid = int(pid_file.read_text())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if str(run_dir).encode() in cmdline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(run_dir, ignore_errors=True)


# --- certificates -------------------------------------------------------------------------

_OPENSSL_CONFIG = """\
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
authorityKeyIdentifier = keyid
[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth
authorityKeyIdentifier = keyid
"""


@dataclass(frozen=True)
class _Pki:
    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    sa_key: Path
    sa_pub: Path


def _openssl(cert_dir: Path, command: str) -> None:
    """Runs ``openssl <command>`` in cert_dir (arguments are separated by single spaces)."""
    result = subprocess.run(
        ["openssl", *command.split()], cwd=cert_dir, capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {command} failed: {result.stderr.strip()}")


def _make_pki(cert_dir: Path) -> _Pki:
    """A throwaway CA (valid 7 days) signing the serving and admin client certificates."""
    if shutil.which("openssl") is None:
        raise ControlPlaneError("the openssl tool is needed to make test certificates")
    cert_dir.mkdir(mode=0o700, parents=True)
    (cert_dir / "openssl.cnf").write_text(_OPENSSL_CONFIG, encoding="utf-8")
    for key in ("ca.key", "apiserver.key", "admin.key", "sa.key"):
        _openssl(cert_dir, f"genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out {key}")
    _openssl(cert_dir, "pkey -in sa.key -pubout -out sa.pub")
    _openssl(
        cert_dir,
        "req -x509 -new -key ca.key -config openssl.cnf -extensions ca -days 7 -sha256"
        " -subj /CN=kdsync-envtest-ca -out ca.crt",
    )
    for name, subject, section in (
        ("apiserver", "/CN=kube-apiserver", "server"),
        ("admin", f"/O=system:masters/CN={ADMIN_USER}", "client"),
    ):
        _openssl(
            cert_dir,
            f"req -new -config openssl.cnf -key {name}.key -subj {subject} -out {name}.csr",
        )
        _openssl(
            cert_dir,
            f"x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 7"
            f" -sha256 -extfile openssl.cnf -extensions {section} -out {name}.crt",
        )
    for key_path in cert_dir.glob("*.key"):
        key_path.chmod(0o600)
    return _Pki(
        ca_cert=cert_dir / "ca.crt",
        server_cert=cert_dir / "apiserver.crt",
        server_key=cert_dir / "apiserver.key",
        client_cert=cert_dir / "admin.crt",
        client_key=cert_dir / "admin.key",
        sa_key=cert_dir / "sa.key",
        sa_pub=cert_dir / "sa.pub",
    )


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


# --- the control plane --------------------------------------------------------------------


class LocalControlPlane:
    """etcd + kube-apiserver on loopback, with an admin kubeconfig.

    ``start()`` (or entering the context manager) returns once ``/readyz`` answers ok and
    the ``default`` namespace exists; ``stop()`` kills both processes and removes the run
    folder (certificates, etcd data, logs) and is safe to call any number of times.
    """

    def __init__(
        self,
        bin_dir: Path | None = None,
        *,
        start_timeout: float = 120.0,
        extra_apiserver_args: Sequence[str] = (),
        keep_run_dir: bool = False,
    ) -> None:
        self.binaries = find_binaries(bin_dir)
        self.start_timeout = start_timeout
        self.extra_apiserver_args = list(extra_apiserver_args)
        self.keep_run_dir = keep_run_dir or os.environ.get("KDSYNC_ENVTEST_KEEP") == "1"
        self._run_dir: Path | None = None
        self._children: list[_Child] = []
        self._server_url: str | None = None
        self._kubeconfig: Path | None = None
        self._pki: _Pki | None = None

    # -- public API --

    @property
    def server_url(self) -> str:
        if self._server_url is None:
            raise ControlPlaneError("the control plane is not running")
        return self._server_url

    @property
    def kubeconfig_path(self) -> Path:
        if self._kubeconfig is None:
            raise ControlPlaneError("the control plane is not running")
        return self._kubeconfig

    @property
    def run_dir(self) -> Path:
        if self._run_dir is None:
            raise ControlPlaneError("the control plane is not running")
        return self._run_dir

    def env(self) -> dict[str, str]:
        """os.environ plus KUBECONFIG pointing at this control plane."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig_path)}

    def kubectl(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Runs kubectl against this control plane; raises KubectlError on failure
        unless ``check=False``."""
        cmd = [str(self.binaries.kubectl), "--kubeconfig", str(self.kubeconfig_path), *args]
        return self._run(cmd, input=input, check=check, timeout=timeout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """Runs helm against this control plane, with its caches inside the run folder."""
        self.binaries.require("helm")
        helm_home = self.run_dir / "helm"
        env = {
            **self.env(),
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }
        cmd = [str(self.binaries.helm), "--kubeconfig", str(self.kubeconfig_path), *args]
        return self._run(cmd, check=check, timeout=timeout, env=env)

    def start(self) -> Self:
        if self._run_dir is not None:
            raise ControlPlaneError("already started")
        tmp_root = Path(tempfile.gettempdir())
        _reap_stale_run_dirs(tmp_root)
        self._run_dir = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=tmp_root))
        (self._run_dir / "owner.pid").write_text(str(os.getpid()))
        try:
            self._pki = _make_pki(self._run_dir / "certs")
            deadline = time.monotonic() + self.start_timeout
            for attempt in range(1, _PORT_ATTEMPTS + 1):
                try:
                    self._start_processes(deadline)
                    break
                except _PortTakenError:
                    self._stop_children()
                    if attempt == _PORT_ATTEMPTS:
                        raise
            self._write_kubeconfig()
            self._wait_for_default_namespace(deadline)
        except BaseException:
            # Keep the logs the error message points at; the next start() reaps the folder
            # once this process has exited.
            self._stop_children()
            self._run_dir = None
            raise
        return self

    def stop(self) -> None:
        """Stops kube-apiserver, then etcd, and removes the run folder."""
        self._stop_children()
        if self._run_dir is not None and not self.keep_run_dir:
            shutil.rmtree(self._run_dir, ignore_errors=True)
        self._run_dir = None
        self._server_url = None
        self._kubeconfig = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals --

    def _run(
        self,
        cmd: list[str],
        *,
        input: str | None = None,
        check: bool,
        timeout: float,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            check=False,
        )
        if check and result.returncode != 0:
            shown = [Path(cmd[0]).name, *cmd[3:]]  # without the --kubeconfig noise
            raise KubectlError(shown, result.returncode, result.stdout, result.stderr)
        return result

    def _spawn(self, name: str, args: list[str]) -> _Child:
        log_path = self.run_dir / f"{name}.log"
        log_file = log_path.open("ab")
        proc = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=self.run_dir,
            start_new_session=True,  # a terminal's Ctrl-C goes to the test run, not to these
            # Only prctl/getppid/_exit run between fork and exec; the brief window is
            # acceptable in tests. Note: the "parent" is the forking *thread*, so start the
            # control plane from a thread that outlives it (e.g. the main thread).
            preexec_fn=_die_with_parent(os.getpid()),  # noqa: PLW1509
        )
        (self.run_dir / f"{name}.pid").write_text(str(proc.pid))
        child = _Child(name, proc, log_path, log_file)
        self._children.append(child)
        return child

    def _start_processes(self, deadline: float) -> None:
        assert self._pki is not None
        run = self.run_dir
        etcd_port, peer_port, api_port = _free_ports(3)
        client_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        data_dir = run / "etcd"
        shutil.rmtree(data_dir, ignore_errors=True)
        etcd = self._spawn(
            "etcd",
            [
                str(self.binaries.etcd),
                "--name=kdsync-envtest",
                f"--data-dir={data_dir}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=kdsync-envtest={peer_url}",
                "--initial-cluster-state=new",
                "--unsafe-no-fsync",  # test data: speed over crash safety
                "--log-level=warn",
            ],
        )
        self._wait_http(etcd, f"{client_url}/health", deadline, ssl_context=None)

        pki = self._pki
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.binaries.kube_apiserver),
                f"--etcd-servers={client_url}",
                f"--cert-dir={pki.server_cert.parent}",
                f"--tls-cert-file={pki.server_cert}",
                f"--tls-private-key-file={pki.server_key}",
                f"--client-ca-file={pki.ca_cert}",
                f"--secure-port={api_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The default reconciler refuses a loopback advertise address; there are
                # no nodes here, so the `kubernetes` Service needs no endpoints.
                "--endpoint-reconciler-type=none",
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--allow-privileged=true",
                "--disable-admission-plugins=ServiceAccount",
                "--profiling=false",
                *self.extra_apiserver_args,
            ],
        )
        self._server_url = f"https://127.0.0.1:{api_port}"
        self._wait_http(apiserver, f"{self._server_url}/readyz", deadline, self._ssl_context())

    def _ssl_context(self) -> ssl.SSLContext:
        assert self._pki is not None
        context = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        context.load_cert_chain(str(self._pki.client_cert), str(self._pki.client_key))
        return context

    def _wait_http(
        self, child: _Child, url: str, deadline: float, ssl_context: ssl.SSLContext | None
    ) -> None:
        """Polls url until it answers 200, the child exits, or the deadline passes."""
        last_error = "no answer yet"
        while True:
            if child.exited():
                log = _tail(child.log_path)
                if "address already in use" in log:
                    raise _PortTakenError(
                        f"{child.name} found its port taken {_PORT_ATTEMPTS} times; "
                        f"last lines of {child.log_path}:\n{log}"
                    )
                raise ControlPlaneError(
                    f"{child.name} exited with {child.proc.returncode} while starting; "
                    f"last lines of {child.log_path}:\n{log}"
                )
            try:
                with urllib.request.urlopen(url, timeout=5, context=ssl_context) as resp:
                    if resp.status == 200:
                        return
                    last_error = f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:  # e.g. 500 while post-start hooks run
                last_error = f"HTTP {exc.code}: {exc.read(2000).decode(errors='replace')}"
            except (urllib.error.URLError, OSError) as exc:
                last_error = str(exc)
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{child.name} not ready at {url} after {self.start_timeout:.0f}s "
                    f"({last_error}); last lines of {child.log_path}:\n{_tail(child.log_path)}"
                )
            # Wait a little before the next probe, but notice at once if the process exits.
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=0.2)

    def _wait_for_default_namespace(self, deadline: float) -> None:
        """/readyz can answer before the bootstrap controller has made namespace default."""
        apiserver = self._children[-1]
        self._wait_http(
            apiserver, f"{self.server_url}/api/v1/namespaces/default", deadline, self._ssl_context()
        )

    def _write_kubeconfig(self) -> None:
        assert self._pki is not None
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "kdsync-envtest",
                    "cluster": {
                        "server": self.server_url,
                        "certificate-authority-data": _b64(self._pki.ca_cert),
                    },
                }
            ],
            "users": [
                {
                    "name": ADMIN_USER,
                    "user": {
                        "client-certificate-data": _b64(self._pki.client_cert),
                        "client-key-data": _b64(self._pki.client_key),
                    },
                }
            ],
            "contexts": [
                {
                    "name": "kdsync-envtest",
                    "context": {"cluster": "kdsync-envtest", "user": ADMIN_USER},
                }
            ],
            "current-context": "kdsync-envtest",
            "preferences": {},
        }
        path = self.run_dir / "kubeconfig"
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        path.chmod(0o600)
        self._kubeconfig = path

    def _stop_children(self) -> None:
        # The API server first, so it does not log etcd connection errors on the way out.
        while self._children:
            child = self._children.pop()
            child.stop(grace=10.0)
