"""What the single-node cluster's processes are started with: pure functions, no I/O.

Addresses are fixed: every node has its own network namespace, so two nodes on one
machine use the same ones without meeting. Inside the namespace, ``NODE_IP`` sits on the
loopback interface; every cluster process listens there or on the namespace's loopback; pods
hang off the CNI bridge ``cni0`` (``POD_SUBNET``) and reach Services through kube-proxy's
iptables rules, which live in the namespace too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

NODE_NAME = "kdsync-node"
NODE_IP = "10.200.0.1"
POD_SUBNET = "10.244.0.0/24"
POD_GATEWAY = "10.244.0.1"
SERVICE_SUBNET = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"
CLUSTER_DOMAIN = "cluster.local"
APISERVER_PORT = 6443
ETCD_CLIENT_URL = "http://127.0.0.1:2379"
ETCD_PEER_URL = "http://127.0.0.1:2380"
# CoreDNS's `ready` plugin answers 200 here once its Kubernetes watches have synced.
COREDNS_READY_PORT = 8181
SERVICE_ACCOUNT_ISSUER = f"https://kubernetes.default.svc.{CLUSTER_DOMAIN}"
# Debian's containernetworking-plugins.
CNI_BIN_DIR = Path("/usr/lib/cni")
RUNC = Path("/usr/sbin/runc")


@dataclass(frozen=True)
class NodePaths:
    """Where one node keeps things. ``run_dir`` holds sockets (short paths: a unix socket
    path has at most 107 bytes) and runtime state; ``data_dir`` everything else."""

    run_dir: Path
    data_dir: Path

    @property
    def containerd_socket(self) -> Path:
        return self.run_dir / "containerd.sock"

    @property
    def containerd_state(self) -> Path:
        return self.run_dir / "containerd"

    @property
    def containerd_root(self) -> Path:
        return self.data_dir / "containerd"

    @property
    def kubelet_root(self) -> Path:
        return self.data_dir / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.data_dir / "pod-logs"

    @property
    def cni_conf_dir(self) -> Path:
        return self.data_dir / "cni" / "net.d"

    @property
    def cni_ipam_dir(self) -> Path:
        return self.data_dir / "cni" / "ipam"

    @property
    def etcd_data(self) -> Path:
        return self.data_dir / "etcd"

    @property
    def pki(self) -> Path:
        return self.data_dir / "pki"

    @property
    def config(self) -> Path:
        return self.data_dir / "config"

    @property
    def logs(self) -> Path:
        return self.data_dir / "logs"


# --- container runtime and network ------------------------------------------------------


def containerd_config(paths: NodePaths, pause_image: str) -> str:
    """containerd 1.6 (Debian's) with its CRI plugin: own socket, folders and CNI setup."""
    quoted = {k: json.dumps(str(v)) for k, v in {
        "root": paths.containerd_root,
        "state": paths.containerd_state,
        "socket": paths.containerd_socket,
        "opt": paths.data_dir / "containerd-opt",
        "cni_bin": CNI_BIN_DIR,
        "cni_conf": paths.cni_conf_dir,
        "runc": RUNC,
        "runc_root": paths.run_dir / "runc",
        "pause": pause_image,
    }.items()}  # fmt: skip
    return f"""\
version = 2
root = {quoted["root"]}
state = {quoted["state"]}
# Snapshotters this machine cannot use would only log errors.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = {quoted["socket"]}

[plugins."io.containerd.internal.v1.opt"]
  path = {quoted["opt"]}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {quoted["pause"]}
  enable_selinux = false
  disable_apparmor = true
  # The kubelet asks for negative OOM scores (-998 for sandboxes); lowering one needs
  # CAP_SYS_RESOURCE, which this machine's capability bounding set lacks (runc then fails
  # with "can't get final child's PID from pipe"). Clamp them at containerd's own (0).
  restrict_oom_score_adj = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = {quoted["runc"]}
  Root = {quoted["runc_root"]}
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = {quoted["cni_bin"]}
  conf_dir = {quoted["cni_conf"]}
"""


def cni_conflist(paths: NodePaths) -> str:
    """One bridge for all pods; no masquerading (nothing leaves the namespace); hairpin so
    a pod reaches itself through its own Service."""
    config = {
        "cniVersion": "1.0.0",
        "name": "kdsync-local-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    # Not /var/lib/cni: two nodes on one machine must not share leases.
                    "dataDir": str(paths.cni_ipam_dir),
                },
            }
        ],
    }
    return json.dumps(config, indent=2) + "\n"


# --- kubelet and kube-proxy ---------------------------------------------------------------


def kubelet_config(paths: NodePaths, client_ca: Path, cgroup_root: str) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # These machines run cgroup v1; kubelets since 1.35 refuse it unless told.
        "failCgroupV1": False,
        # Debian's containerd 1.6 cannot report its cgroup driver (the RuntimeConfig CRI
        # call came in 2.0); Kubernetes 1.37 still falls back to this setting.
        "cgroupDriver": "cgroupfs",
        # All pod cgroups below a root of this node's own, so nodes side by side never
        # touch each other's (or the machine's) cgroups.
        "cgroupRoot": cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "address": NODE_IP,
        "port": 10250,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "authentication": {
            "x509": {"clientCAFile": str(client_ca)},
            "webhook": {"enabled": False},
            "anonymous": {"enabled": False},
        },
        # Only the API server (and admins) hold certificates of this CA.
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [NODE_IP],
        # Empty: pods get no search domains or name servers of the machine.
        "resolvConf": str(paths.config / "resolv.conf"),
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.data_dir / "volume-plugins"),
        "failSwapOn": False,
        # Not -999: lowering a score needs CAP_SYS_RESOURCE, which this machine lacks.
        "oomScoreAdj": 0,
        "serializeImagePulls": False,
        # The machine's disk and memory are shared with other work: evict only when truly
        # out, and never garbage-collect images (they cannot be pulled again here).
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
            "nodefs.inodesFree": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "containerLogMaxSize": "10Mi",
        "maxPods": 60,
    }
    return yaml.safe_dump(config, sort_keys=False)


def kube_proxy_config(kubeconfig: Path) -> str:
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "clusterCIDR": POD_SUBNET,
        "oomScoreAdj": 0,  # see kubelet_config
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Leave the machine-wide conntrack table size and timeouts alone.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    return yaml.safe_dump(config, sort_keys=False)


def corefile(kubeconfig: Path) -> str:
    """Cluster names only: there is nothing outside the namespace to forward to."""
    return f"""\
.:53 {{
    bind {NODE_IP}
    errors
    ready {NODE_IP}:{COREDNS_READY_PORT}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig} kdsync-local-node
        pods insecure
        ttl 5
        fallthrough in-addr.arpa ip6.arpa
    }}
    cache 5
}}
"""


# --- command lines ------------------------------------------------------------------------


@dataclass(frozen=True)
class ControlPlaneFiles:
    """Certificate and kubeconfig paths the command lines refer to."""

    ca_cert: Path
    ca_key: Path
    apiserver_cert: Path
    apiserver_key: Path
    kubelet_client_cert: Path
    kubelet_client_key: Path
    service_account_key: Path
    service_account_pub: Path
    controller_manager_kubeconfig: Path
    scheduler_kubeconfig: Path


def etcd_args(paths: NodePaths) -> list[str]:
    return [
        "--name=kdsync-node",
        f"--data-dir={paths.etcd_data}",
        f"--listen-client-urls={ETCD_CLIENT_URL}",
        f"--advertise-client-urls={ETCD_CLIENT_URL}",
        f"--listen-peer-urls={ETCD_PEER_URL}",
        f"--initial-advertise-peer-urls={ETCD_PEER_URL}",
        f"--initial-cluster=kdsync-node={ETCD_PEER_URL}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",  # test data: speed over crash safety
        "--log-level=warn",
    ]


def apiserver_args(files: ControlPlaneFiles) -> list[str]:
    return [
        f"--etcd-servers={ETCD_CLIENT_URL}",
        "--bind-address=0.0.0.0",  # inside the node's namespace only
        f"--advertise-address={NODE_IP}",
        f"--secure-port={APISERVER_PORT}",
        f"--tls-cert-file={files.apiserver_cert}",
        f"--tls-private-key-file={files.apiserver_key}",
        f"--client-ca-file={files.ca_cert}",
        f"--kubelet-client-certificate={files.kubelet_client_cert}",
        f"--kubelet-client-key={files.kubelet_client_key}",
        # The node's name resolves nowhere (no DNS for nodes): dial its address.
        "--kubelet-preferred-address-types=InternalIP",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        f"--service-cluster-ip-range={SERVICE_SUBNET}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={files.service_account_pub}",
        f"--service-account-signing-key-file={files.service_account_key}",
        "--allow-privileged=true",
        "--profiling=false",
        "--event-ttl=30m",
    ]


def controller_manager_args(files: ControlPlaneFiles) -> list[str]:
    return [
        f"--kubeconfig={files.controller_manager_kubeconfig}",
        f"--authentication-kubeconfig={files.controller_manager_kubeconfig}",
        f"--authorization-kubeconfig={files.controller_manager_kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        # Each controller acts as its own ServiceAccount, as kubeadm sets it up.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={files.service_account_key}",
        # Published as the kube-root-ca.crt ConfigMap that projected tokens carry.
        f"--root-ca-file={files.ca_cert}",
        f"--cluster-signing-cert-file={files.ca_cert}",
        f"--cluster-signing-key-file={files.ca_key}",
        f"--service-cluster-ip-range={SERVICE_SUBNET}",
        "--allocate-node-cidrs=false",
        "--profiling=false",
    ]


def scheduler_args(files: ControlPlaneFiles) -> list[str]:
    return [
        f"--kubeconfig={files.scheduler_kubeconfig}",
        f"--authentication-kubeconfig={files.scheduler_kubeconfig}",
        f"--authorization-kubeconfig={files.scheduler_kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
    ]


def kubelet_args(paths: NodePaths, kubeconfig: Path) -> list[str]:
    return [
        f"--config={paths.config / 'kubelet.yaml'}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={paths.kubelet_root}",
        f"--cert-dir={paths.kubelet_root / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
    ]
