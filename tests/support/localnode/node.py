"""A real single-node Kubernetes cluster on this machine, in a network namespace of its own.

kind cannot start here (it runs its nodes ``--privileged``, which this machine refuses:
no CAP_SYS_RESOURCE in the bounding set), so the cluster runs as plain processes on the
host, as root, each joined to the node's network namespace with ``nsenter --net``:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and
CoreDNS (built by ``hack/fetch-k8s node``), containerd and runc from Debian (CRI plugin,
overlayfs, cgroupfs), and Debian's CNI plugins (one bridge). Nothing is added to the
host's own network: pods, Services, iptables rules and DNS live in the namespace. The
only way in is a relay (two socat processes joined by a unix socket) from a free port on
the host's loopback to the API server, which the admin kubeconfig points at.

Images are not pulled (no registry is reachable): the archives ``hack/build-images``
saves are imported into containerd before the node is reported ready.

Use it as a context manager (or ``start()``/``stop()``)::

    with LocalNode(images=archives) as node:
        node.kubectl("get", "nodes")

``stop()`` stops the node agents, kills every container through the node's cgroups,
stops containerd and the control plane, unmounts what remains below its folders, removes
the pods' network namespaces and deletes the node's. Every process
dies with the Python process that started it (``PR_SET_PDEATHSIG``); a later start reaps
nodes whose owner is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self, TypeVar

from kdsync.localkafka.process import (
    PidRegistry,
    ProcessIdentity,
    kill_orphans,
    spawn_tied_to_parent,
)
from tests.support.envtest import KubectlError, default_bin_dir
from tests.support.localnode import configs
from tests.support.localnode.configs import NODE_IP, ControlPlaneFiles, NodePaths
from tests.support.localnode.pki import ClusterPki

__all__ = ["LocalNode", "NodeError", "reap_stale_nodes"]

REPO_ROOT = Path(__file__).resolve().parents[3]
RUN_ROOT = Path("/run/kdsync-node")
DEFAULT_DATA_ROOT = REPO_ROOT / ".kdsync-run" / "node"
CGROUP_ROOT = Path("/sys/fs/cgroup")
NODE_BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
    "coredns",
    "kubectl",
    "helm",
)
# Host tools and the Debian package that has each (hack/local-node installs them).
HOST_TOOLS = {
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "ctr": "containerd",
    "runc": "runc",
    "socat": "socat",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "nsenter": "util-linux",
    "ip": "iproute2",
}
PAUSE_IMAGE = "docker.io/library/kdsync-pause:3.10.2"
_POD_CPU_SHARES = 1024 * (os.cpu_count() or 1)
_CLONE_NEWNET = 0x40000000
_MNT_DETACH = 2
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
T = TypeVar("T")


class NodeError(RuntimeError):
    """The node could not be started, used or stopped; the message says what to look at."""


# --- small helpers ------------------------------------------------------------------------


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def in_namespace(netns: Path, call: Callable[[], T]) -> T:
    """Runs ``call`` on a thread joined to the network namespace ``netns`` (a thread may
    switch network namespace on its own); sockets it opens live in that namespace."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fd = os.open(netns, os.O_RDONLY)
            try:
                if _LIBC.setns(fd, _CLONE_NEWNET) != 0:
                    error = ctypes.get_errno()
                    raise OSError(error, f"setns({netns}): {os.strerror(error)}")
            finally:
                os.close(fd)
            outcome.append(call())
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=target, name=f"netns {netns.name}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _run(args: Sequence[str], *, check: bool = True, timeout: float = 60) -> str:
    result = subprocess.run(
        list(args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise NodeError(f"`{' '.join(args)}` failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout


# --- cleaning up (shared by stop() and the reaper) ---------------------------------------


def _netns_name(node_id: str) -> str:
    return f"kdsync-node-{node_id}"


def _cgroup_name(node_id: str) -> str:
    return f"kdsync-node-{node_id}"


def _cgroup_dirs(node_id: str) -> list[Path]:
    """The node's cgroup root in every v1 hierarchy (and the unified one, if runc used it)."""
    if not CGROUP_ROOT.is_dir():
        return []
    return [h / _cgroup_name(node_id) for h in sorted(CGROUP_ROOT.iterdir()) if h.is_dir()]


def _cgroup_processes(node_id: str) -> set[int]:
    """Every process in the node's cgroups: the pods' containers."""
    found: set[int] = set()
    for root in _cgroup_dirs(node_id):
        if not root.is_dir():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(pid) for pid in procs.read_text().split())
    return found


def _netns_inodes(pids: set[int]) -> set[int]:
    inodes: set[int] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
    return inodes


def _remove_pod_netns(inodes: set[int]) -> None:
    """containerd pins each pod's network namespace at /run/netns/cni-<uuid>; removes those
    of our pods (known by inode: other nodes' pods use the same folder)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            point, root = fields[4], fields[3]
            if not point.startswith("/run/netns/cni-") or not root.startswith("net:["):
                continue
            if int(root[len("net:[") : -1]) in inodes:
                _LIBC.umount2(point.encode(), _MNT_DETACH)
                with contextlib.suppress(OSError):
                    os.unlink(point)


def _kill_shims(socket_path: Path) -> None:
    """containerd shims outlive containerd; ours name our socket on their command line."""
    marker = str(socket_path).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            if b"containerd-shim" in cmdline and marker in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(proc.name), signal.SIGKILL)


def _unmount_below(*folders: Path) -> None:
    """Lazily unmounts every mount point below the folders, deepest first."""
    prefixes = [str(f.resolve()) + "/" for f in folders]
    points: list[str] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].encode().decode("unicode_escape")
            if any(point.startswith(p) for p in prefixes):
                points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        _LIBC.umount2(point.encode(), _MNT_DETACH)


def _remove_cgroups(node_id: str) -> None:
    for root in _cgroup_dirs(node_id):
        if not root.is_dir():
            continue
        for folder in sorted(
            (p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)
        ):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            root.rmdir()


def _teardown_leftovers(node_id: str, paths: NodePaths, keep_data: bool) -> None:
    """Everything stop() does after the processes it knows of are gone, idempotently."""
    registry = PidRegistry(paths.run_dir / "pids")
    for entry in registry.entries():
        with contextlib.suppress(ProcessLookupError):
            os.kill(entry.process.pid, signal.SIGKILL)
    pod_netns: set[int] = set()
    for _ in range(3):  # a dying shim can still start one last process
        containers = _cgroup_processes(node_id)
        pod_netns |= _netns_inodes(containers)
        for pid in containers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _kill_shims(paths.containerd_socket)
        time.sleep(0.2)
    _unmount_below(paths.run_dir, paths.data_dir)
    _remove_pod_netns(pod_netns)
    _remove_cgroups(node_id)
    subprocess.run(
        ["ip", "netns", "delete", _netns_name(node_id)], capture_output=True, check=False
    )
    shutil.rmtree(paths.run_dir, ignore_errors=True)
    if not keep_data:
        shutil.rmtree(paths.data_dir, ignore_errors=True)


def reap_stale_nodes(data_root: Path = DEFAULT_DATA_ROOT) -> list[str]:
    """Tears down nodes whose owning process has died; returns their ids."""
    reaped: list[str] = []
    if not RUN_ROOT.is_dir():
        return reaped
    for run_dir in sorted(RUN_ROOT.iterdir()):
        try:
            owner = ProcessIdentity.from_json(json.loads((run_dir / "owner.json").read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            owner = None
        if owner is not None and owner.is_alive():
            continue
        data_dir = (
            Path((run_dir / "data-dir").read_text())
            if (run_dir / "data-dir").exists()
            else data_root / run_dir.name
        )
        kill_orphans(PidRegistry(run_dir / "pids"))
        _teardown_leftovers(run_dir.name, NodePaths(run_dir, data_dir), keep_data=False)
        reaped.append(run_dir.name)
    return reaped


# --- the node -----------------------------------------------------------------------------


# Stopped after the pods are gone, in reverse start order.
_LAST_TO_STOP = frozenset({"containerd", "kube-apiserver", "etcd"})


class _Child:
    def __init__(self, name: str, proc: subprocess.Popen[bytes], log: Path, log_file: IO[bytes]):
        self.name, self.proc, self.log, self._log_file = name, proc, log, log_file

    def terminate(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()

    def reap(self, deadline: float) -> None:
        """Waits for the process until ``deadline`` (monotonic), then kills it."""
        try:
            self.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait(timeout=30)
        self._log_file.close()


def _stop_together(children: list[_Child], grace: float = 10.0) -> None:
    """SIGTERM to all at once, then one shared grace period: stopping a handful of agents
    one after another cost up to their graces added up."""
    for child in children:
        child.terminate()
    deadline = time.monotonic() + grace
    for child in children:
        child.reap(deadline)


class LocalNode:
    """One single-node cluster. ``kubeconfig_path`` is an admin kubeconfig for the host."""

    def __init__(
        self,
        *,
        images: Sequence[Path] = (),
        bin_dir: Path | None = None,
        data_root: Path | None = None,
        start_timeout: float = 300.0,
        keep_data: bool = False,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.bin_dir = bin_dir if bin_dir is not None else default_bin_dir()
        self.images = list(images)
        self.start_timeout = start_timeout
        self.keep_data = keep_data or os.environ.get("KDSYNC_NODE_KEEP") == "1"
        self._progress = progress or (lambda _text: None)
        self.id = f"{os.getpid()}-{secrets.token_hex(2)}"
        self.paths = NodePaths(RUN_ROOT / self.id, (data_root or DEFAULT_DATA_ROOT) / self.id)
        self.netns = Path("/run/netns") / _netns_name(self.id)
        self.cgroup_root = f"/{_cgroup_name(self.id)}"
        self._children: list[_Child] = []
        self._registry = PidRegistry(self.paths.run_dir / "pids")
        self._kubeconfig: Path | None = None
        self._api_port: int | None = None
        self._pki: ClusterPki | None = None
        self._started = False
        self.timings: dict[str, float] = {}

    # -- public API --

    @property
    def kubeconfig_path(self) -> Path:
        if self._kubeconfig is None:
            raise NodeError("the node is not running")
        return self._kubeconfig

    @property
    def server_url(self) -> str:
        return f"https://127.0.0.1:{self._api_port}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig_path)}

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        return self._tool("kubectl", args, input=input, check=check, timeout=timeout)

    def helm(
        self, *args: str, check: bool = True, timeout: float = 600.0
    ) -> subprocess.CompletedProcess[str]:
        helm_home = self.paths.data_dir / "helm"
        env = {
            "HELM_CACHE_HOME": str(helm_home / "cache"),
            "HELM_CONFIG_HOME": str(helm_home / "config"),
            "HELM_DATA_HOME": str(helm_home / "data"),
        }
        return self._tool("helm", args, check=check, timeout=timeout, extra_env=env)

    def import_images(self, archives: Sequence[Path]) -> None:
        """Imports image archives (docker save / OCI) into the node's containerd."""
        for archive in archives:
            if not archive.is_file():
                raise NodeError(f"no image archive {archive}: run hack/build-images")
            self._ctr("images", "import", str(archive), timeout=900)

    def start(self) -> Self:
        if self._started:
            raise NodeError("already started")
        self._check_host()
        reap_stale_nodes(self.paths.data_dir.parent)
        began = time.monotonic()
        deadline = began + self.start_timeout
        self._started = True
        try:
            self._prepare()
            self._start_control_plane(deadline)
            importer = self._start_runtime(deadline)
            self._start_node_agents()
            self._wait_ready(deadline, importer)
        except BaseException:
            self.keep_data = True  # the logs the error points at
            self.stop()
            raise
        self.timings["start"] = time.monotonic() - began
        return self

    def stop(self) -> None:
        """Stops everything and removes the namespace, cgroups, mounts and folders."""
        if not self._started:
            return
        self._started = False
        # The node goes as a whole: its pods are not drained one by one through the API
        # (half a minute of graceful stops); the agents stop first so that nothing restarts
        # a container, then every container is killed through the node's cgroups, and
        # the mounts and pod network namespaces left behind are removed.
        began = time.monotonic()
        _stop_together([c for c in self._children if c.name not in _LAST_TO_STOP])
        pods = _cgroup_processes(self.id)
        pod_netns = _netns_inodes(pods)
        for pid in pods:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        last = {c.name: c for c in self._children if c.name in _LAST_TO_STOP}
        # containerd and the API server together, etcd after the API server that writes to it.
        _stop_together([last[n] for n in ("containerd", "kube-apiserver") if n in last])
        _stop_together([last[n] for n in ("etcd",) if n in last])
        self._children.clear()
        self.timings["stop: processes"] = time.monotonic() - began
        _teardown_leftovers(self.id, self.paths, keep_data=self.keep_data)
        _remove_pod_netns(pod_netns)
        self.timings["stop"] = time.monotonic() - began

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def in_node(self, call: Callable[[], T]) -> T:
        """Runs ``call`` with its sockets in the node's network namespace."""
        return in_namespace(self.netns, call)

    # -- starting --

    def _check_host(self) -> None:
        if os.geteuid() != 0:
            raise NodeError("a local node needs root (containerd, network namespaces, cgroups)")
        missing = [t for t in HOST_TOOLS if shutil.which(t) is None]
        if missing or not (configs.CNI_BIN_DIR / "bridge").exists():
            packages = sorted({HOST_TOOLS[t] for t in missing} | {"containernetworking-plugins"})
            raise NodeError(
                f"missing host tools ({', '.join(missing) or 'CNI plugins'}): run "
                f"hack/host-packages {' '.join(packages)} (hack/local-node does this)"
            )
        absent = [b for b in NODE_BINARIES if not os.access(self.bin_dir / b, os.X_OK)]
        if absent:
            raise NodeError(
                f"missing {', '.join(absent)} in {self.bin_dir}: run hack/fetch-k8s node"
            )

    def _prepare(self) -> None:
        paths = self.paths
        for folder in (paths.run_dir, paths.data_dir, paths.config, paths.logs, paths.cni_conf_dir):
            folder.mkdir(parents=True, exist_ok=True)
        (paths.run_dir / "owner.json").write_text(json.dumps(ProcessIdentity.current().to_json()))
        (paths.run_dir / "data-dir").write_text(str(paths.data_dir))
        # The namespace: loopback, also holding the node address (the kernel here has no
        # dummy interfaces), forwarding for pods, and bridged pod traffic through iptables
        # (so a reply between two pods behind a Service is translated back).
        name = _netns_name(self.id)
        _run(["ip", "netns", "add", name])
        _run(["ip", "-n", name, "link", "set", "lo", "up"])
        _run(["ip", "-n", name, "addr", "add", f"{NODE_IP}/32", "dev", "lo"])
        # A route for Service addresses, so that a connection from the namespace itself
        # (the API server calling a webhook) gets as far as kube-proxy's DNAT rule.
        _run(["ip", "-n", name, "route", "add", configs.SERVICE_SUBNET, "dev", "lo"])
        _run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "sysctl",
                "-q",
                "-w",
                "net.ipv4.ip_forward=1",
                "net.bridge.bridge-nf-call-iptables=1",
            ]
        )
        # The cgroup root of the node's pods, in every hierarchy (cpuset needs its CPUs and
        # memory nodes copied from the parent before anything can join).
        for folder in _cgroup_dirs(self.id):
            with contextlib.suppress(FileExistsError):
                folder.mkdir()
            if folder.parent.name == "cpuset":
                for item in ("cpuset.cpus", "cpuset.mems"):
                    (folder / item).write_text((folder.parent / item).read_text())
            # The CPU weight a real node gives its pods' cgroup (kubepods: 1024 per CPU). A
            # new cgroup weighs as much as one process, so on a busy machine all the pods
            # together (brokers, sidecars, Spark) would get one process's share of the CPU.
            shares = folder / "cpu.shares"
            if shares.exists():
                shares.write_text(str(_POD_CPU_SHARES))
        self._write_pki_and_configs()

    def _write_pki_and_configs(self) -> None:
        paths = self.paths
        pki = self._pki = ClusterPki(paths.pki)
        inner = f"https://127.0.0.1:{configs.APISERVER_PORT}"
        server_names = [
            "127.0.0.1",
            NODE_IP,
            configs.KUBERNETES_SERVICE_IP,
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            f"kubernetes.default.svc.{configs.CLUSTER_DOMAIN}",
        ]
        apiserver = pki.issue("apiserver", "kube-apiserver", server_names=server_names)
        kubelet_client = pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=["system:masters"],
        )
        admin = pki.issue("admin", "kdsync-admin", organizations=["system:masters"])
        kubeconfigs: dict[str, Path] = {}
        for name, user, groups in (
            ("controller-manager", "system:kube-controller-manager", ()),
            ("scheduler", "system:kube-scheduler", ()),
            ("kubelet", f"system:node:{configs.NODE_NAME}", ("system:nodes",)),
            ("kube-proxy", "system:kube-proxy", ()),
        ):
            credential = pki.issue(name, user, organizations=groups)
            kubeconfigs[name] = pki.kubeconfig(
                paths.config / f"{name}.kubeconfig", inner, user, credential
            )
        # CoreDNS reads Services, EndpointSlices, Namespaces and Pods; Kubernetes has no
        # default role for it (kubeadm adds one), so it uses the admin credential.
        kubeconfigs["coredns"] = pki.kubeconfig(
            paths.config / "admin-inner.kubeconfig", inner, "kdsync-admin", admin
        )
        self._api_port = _free_port()
        self._kubeconfig = pki.kubeconfig(
            paths.config / "admin.kubeconfig", self.server_url, "kdsync-admin", admin
        )
        self._files = ControlPlaneFiles(
            ca_cert=pki.ca_cert,
            ca_key=pki.ca_key,
            apiserver_cert=apiserver.cert,
            apiserver_key=apiserver.key,
            kubelet_client_cert=kubelet_client.cert,
            kubelet_client_key=kubelet_client.key,
            service_account_key=pki.service_account_key,
            service_account_pub=pki.service_account_pub,
            controller_manager_kubeconfig=kubeconfigs["controller-manager"],
            scheduler_kubeconfig=kubeconfigs["scheduler"],
        )
        self._kubeconfigs = kubeconfigs
        write = {
            "containerd.toml": configs.containerd_config(paths, PAUSE_IMAGE),
            "kubelet.yaml": configs.kubelet_config(paths, pki.ca_cert, self.cgroup_root),
            "kube-proxy.yaml": configs.kube_proxy_config(kubeconfigs["kube-proxy"]),
            "Corefile": configs.corefile(kubeconfigs["coredns"]),
            "resolv.conf": "",
        }
        for name, text in write.items():
            (paths.config / name).write_text(text, encoding="utf-8")
        (paths.cni_conf_dir / "10-kdsync.conflist").write_text(configs.cni_conflist(paths))

    def _spawn(self, name: str, argv: Sequence[str], *, in_node: bool = True) -> _Child:
        log = self.paths.logs / f"{name}.log"
        log_file = log.open("ab")
        command = [*(["nsenter", f"--net={self.netns}", "--"] if in_node else []), *argv]
        proc = spawn_tied_to_parent(command, log_file=log_file, cwd=self.paths.data_dir)
        identity = ProcessIdentity.of(proc.pid)
        if identity is not None:
            self._registry.register(name, identity)
        child = _Child(name, proc, log, log_file)
        self._children.append(child)
        return child

    def _binary(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _start_control_plane(self, deadline: float) -> None:
        self._progress("starting etcd and kube-apiserver")
        self._spawn("etcd", [self._binary("etcd"), *configs.etcd_args(self.paths)])
        apiserver = self._spawn(
            "kube-apiserver", [self._binary("kube-apiserver"), *configs.apiserver_args(self._files)]
        )
        # The host's way in: loopback port -> unix socket -> the namespace's loopback.
        relay = self.paths.run_dir / "apiserver.sock"
        self._spawn(
            "relay-apiserver-node",
            [
                "socat",
                f"UNIX-LISTEN:{relay},fork,unlink-early",
                f"TCP:127.0.0.1:{configs.APISERVER_PORT}",
            ],
        )
        self._spawn(
            "relay-apiserver-host",
            [
                "socat",
                f"TCP-LISTEN:{self._api_port},bind=127.0.0.1,reuseaddr,fork",
                f"UNIX-CONNECT:{relay}",
            ],
            in_node=False,
        )
        assert self._pki is not None
        context = ssl.create_default_context(cafile=str(self._pki.ca_cert))
        admin = self._pki.folder
        context.load_cert_chain(str(admin / "admin.crt"), str(admin / "admin.key"))
        self._wait(
            "kube-apiserver /readyz",
            lambda: _http_ok(f"{self.server_url}/readyz", context),
            deadline,
            apiserver,
        )
        self.timings["apiserver ready"] = time.monotonic()

    def _start_runtime(self, deadline: float) -> threading.Thread | None:
        self._progress("starting containerd")
        containerd = self._spawn(
            "containerd", ["containerd", f"--config={self.paths.config / 'containerd.toml'}"]
        )
        self._wait(
            "containerd",
            lambda: self._ctr("version", check=False) is not None,
            deadline,
            containerd,
        )
        if not self.images:
            return None
        failures: list[BaseException] = []

        def import_all() -> None:
            began = time.monotonic()
            try:
                self.import_images(self.images)
            except BaseException as exc:
                failures.append(exc)
            self.timings["image import"] = time.monotonic() - began

        self._progress(f"importing {len(self.images)} image archive(s) into containerd")
        importer = threading.Thread(target=import_all, name="image import", daemon=True)
        importer.failures = failures  # type: ignore[attr-defined]
        importer.start()
        return importer

    def _start_node_agents(self) -> None:
        self._progress(
            "starting kube-controller-manager, kube-scheduler, kubelet, kube-proxy, coredns"
        )
        files = self._files
        self._spawn(
            "kube-controller-manager",
            [self._binary("kube-controller-manager"), *configs.controller_manager_args(files)],
        )
        self._spawn(
            "kube-scheduler", [self._binary("kube-scheduler"), *configs.scheduler_args(files)]
        )
        self._spawn(
            "kubelet",
            [
                self._binary("kubelet"),
                *configs.kubelet_args(self.paths, self._kubeconfigs["kubelet"]),
            ],
        )
        self._spawn(
            "kube-proxy",
            [self._binary("kube-proxy"), f"--config={self.paths.config / 'kube-proxy.yaml'}"],
        )
        self._spawn(
            "coredns", [self._binary("coredns"), "-conf", str(self.paths.config / "Corefile")]
        )

    def _wait_ready(self, deadline: float, importer: threading.Thread | None) -> None:
        by_name = {child.name: child for child in self._children}
        self._wait("node Ready", self._node_ready, deadline, by_name["kubelet"])
        self._wait(
            "the default ServiceAccount",
            lambda: (
                self.kubectl(
                    "get", "serviceaccount", "default", "-n", "default", check=False
                ).returncode
                == 0
            ),
            deadline,
            by_name["kube-controller-manager"],
        )
        ready = f"http://{NODE_IP}:{configs.COREDNS_READY_PORT}/ready"
        self._wait(
            "CoreDNS", lambda: self.in_node(lambda: _http_ok(ready)), deadline, by_name["coredns"]
        )
        self._wait(
            "kube-proxy",
            lambda: self.in_node(lambda: _http_ok("http://127.0.0.1:10256/healthz")),
            deadline,
            by_name["kube-proxy"],
        )
        if importer is not None:
            importer.join(max(0.0, deadline - time.monotonic()))
            failures: list[BaseException] = importer.failures  # type: ignore[attr-defined]
            if failures:
                raise NodeError(f"importing images failed: {failures[0]}")
            if importer.is_alive():
                raise NodeError("importing images did not finish in time")

    def _node_ready(self) -> bool:
        result = self.kubectl("get", "node", configs.NODE_NAME, "-o", "json", check=False)
        if result.returncode != 0:
            return False
        conditions = json.loads(result.stdout).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def _wait(self, what: str, probe: Callable[[], bool], deadline: float, child: _Child) -> None:
        while True:
            if child.proc.poll() is not None:
                raise NodeError(
                    f"{child.name} exited with {child.proc.returncode} while waiting for {what}; "
                    f"last lines of {child.log}:\n{_tail(child.log)}"
                )
            if probe():
                return
            if time.monotonic() > deadline:
                raise NodeError(
                    f"timed out waiting for {what} (logs in {self.paths.logs}); last lines of "
                    f"{child.log}:\n{_tail(child.log)}"
                )
            time.sleep(0.5)

    # -- running tools --

    def _tool(
        self,
        tool: str,
        args: Sequence[str],
        *,
        input: str | None = None,
        check: bool,
        timeout: float,
        extra_env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        command = [self._binary(tool), "--kubeconfig", str(self.kubeconfig_path), *args]
        result = subprocess.run(
            command,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={**os.environ, **(extra_env or {})},
        )
        if check and result.returncode != 0:
            raise KubectlError([tool, *args], result.returncode, result.stdout, result.stderr)
        return result

    def _ctr(self, *args: str, check: bool = True, timeout: float = 60) -> str | None:
        command = [
            "ctr",
            "--address",
            str(self.paths.containerd_socket),
            "--namespace",
            "k8s.io",
            *args,
        ]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            if check:
                raise NodeError(f"`ctr {' '.join(args)}` failed: {result.stderr.strip()}")
            return None
        return result.stdout
