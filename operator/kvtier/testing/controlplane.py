"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

    with ControlPlane(find_binaries()) as plane:     # or .start() / .stop()
        subprocess.run(["kubectl", "--kubeconfig", plane.kubeconfig, "get", "ns"])

The binaries are built from the published Go modules by ``hack/control-plane.sh`` (into
``${KVTIER_CACHE:-~/.cache/kvtier}/control-plane/<versions>/bin``; ``$KVTIER_CONTROL_PLANE_BIN``
names another directory). Each start makes a fresh temporary directory with a CA, serving and
client certificates (``openssl``), a service-account signing key, etcd's data and every
component's log; free ports; authorization ``Node,RBAC``. The controller manager runs its default
controllers (StatefulSet, Job, garbage collector, namespace, PV binder and expander,
service-account and token controllers, node lifecycle ...) with one service account per
controller, as in production. No kubelet, no CSI driver: :mod:`kvtier.testing.podsim` stands in
for them. ``stop()`` ends every process group and removes the directory, whatever happened.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
BIN_ENV = "KVTIER_CONTROL_PLANE_BIN"
#: The cluster's Service network (the apiserver's `kubernetes` Service takes its first address).
SERVICE_CIDR = "10.96.0.0/16"


class ControlPlaneUnavailable(RuntimeError):
    """The binaries are missing (not built) or a tool the harness needs is not installed."""


def cache_root() -> Path:
    return Path(os.environ.get("KVTIER_CACHE") or Path.home() / ".cache" / "kvtier") / "control-plane"


def find_binaries() -> Path:
    """The directory holding all four components: ``$KVTIER_CONTROL_PLANE_BIN``, else the newest build in the cache."""
    configured = os.environ.get(BIN_ENV)
    candidates = (
        [Path(configured)]
        if configured
        else sorted(cache_root().glob("*/bin"), key=lambda path: path.stat().st_mtime, reverse=True)
    )
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in COMPONENTS):
            return directory
    where = f"${BIN_ENV}={configured}" if configured else str(cache_root() / "*" / "bin")
    raise ControlPlaneUnavailable(
        f"no control plane binaries ({', '.join(COMPONENTS)}) in {where}: build them with ./hack/control-plane.sh (needs Go)"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr.strip()}")


def make_certificates(directory: Path) -> None:
    """CA, the apiserver's serving certificate, an admin client certificate (system:masters), a service-account key."""
    if shutil.which("openssl") is None:
        raise ControlPlaneUnavailable("the control plane harness needs the `openssl` command to make certificates")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=kvtier-test-ca",
        cwd=directory,
    )
    sans = (
        "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    )
    for name, subject, extensions in (
        ("apiserver", "/CN=kube-apiserver", [sans, "extendedKeyUsage=serverAuth"]),
        ("admin", "/O=system:masters/CN=kvtier-admin", ["extendedKeyUsage=clientAuth"]),
    ):
        _openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject, cwd=directory)
        (directory / f"{name}.ext").write_text("\n".join(["basicConstraints=CA:FALSE", *extensions]) + "\n")
        _openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            f"{name}.crt",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            cwd=directory,
        )
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "sa.key", cwd=directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)


def kubeconfig(
    server: str, ca: Path, *, user: str, token: str | None = None, cert: Path | None = None, key: Path | None = None
) -> dict[str, Any]:
    """A one-context kubeconfig: client certificate or bearer token."""
    credentials: dict[str, Any] = (
        {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    )
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": user,
        "preferences": {},
        "clusters": [{"name": "kvtier-control-plane", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": credentials}],
        "contexts": [{"name": user, "context": {"cluster": "kvtier-control-plane", "user": user}}],
    }


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler from ``binaries``, in a temporary directory."""

    def __init__(self, binaries: Path | None = None, *, kubeconfig: str | Path | None = None):
        self.binaries = binaries or find_binaries()
        self._requested_kubeconfig = Path(kubeconfig) if kubeconfig else None
        self.directory: Path | None = None
        self.url = ""
        self.kubeconfig = Path()
        #: Seconds the last start took (certificates to a working controller manager).
        self.startup_seconds = 0.0
        self._processes: list[_Process] = []

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, timeout: float = 120) -> ControlPlane:
        """Start every component and return once the apiserver is ready and the controllers work."""
        started = time.monotonic()
        self.directory = Path(tempfile.mkdtemp(prefix="kvtier-control-plane-"))
        atexit.register(self.stop)  # no process outlives the interpreter, whatever the caller forgot
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def _start(self, timeout: float) -> None:
        assert self.directory is not None
        d = self.directory
        make_certificates(d)
        etcd_port, etcd_peer, api_port = free_port(), free_port(), free_port()
        self.url = f"https://127.0.0.1:{api_port}"
        components_kubeconfig = d / "components.kubeconfig"
        self.write_kubeconfig(components_kubeconfig, user="kvtier-admin", cert=d / "admin.crt", key=d / "admin.key")
        self._spawn(
            "etcd",
            [
                "--name=kvtier",
                f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{etcd_peer}",
                f"--initial-cluster=kvtier=http://127.0.0.1:{etcd_peer}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={d / 'ca.crt'}",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                f"--cert-dir={d / 'apiserver-certs'}",
                "--profiling=false",
                "--v=1",
                "--endpoint-reconciler-type=none",  # the `kubernetes` Service may not point at 127.0.0.1
            ],
        )
        self._wait_ready(self.url + "/readyz", timeout, component="kube-apiserver")
        self._spawn(
            "kube-controller-manager",
            [
                f"--kubeconfig={components_kubeconfig}",
                f"--authentication-kubeconfig={components_kubeconfig}",
                f"--authorization-kubeconfig={components_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={d / 'kcm-certs'}",
                "--leader-elect=false",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
                "--profiling=false",
                "--v=1",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                f"--kubeconfig={components_kubeconfig}",
                f"--authentication-kubeconfig={components_kubeconfig}",
                f"--authorization-kubeconfig={components_kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--cert-dir={d / 'scheduler-certs'}",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        )
        # The controller manager works once the service-account controller made `default`'s account.
        self._wait_ready(
            self.url + "/api/v1/namespaces/default/serviceaccounts/default",
            timeout,
            component="kube-controller-manager",
            authenticated=True,
        )
        # Written last: a kubeconfig that exists is one that works.
        self.kubeconfig = self._requested_kubeconfig or d / "admin.kubeconfig"
        self.write_kubeconfig(self.kubeconfig, user="kvtier-admin", cert=d / "admin.crt", key=d / "admin.key")

    def stop(self) -> None:
        """End every component (SIGTERM to its process group, SIGKILL after 10s) and remove the directory."""
        for process in reversed(self._processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.popen.pid, signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.popen.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.popen.pid, signal.SIGKILL)
                process.popen.wait(10)
        self._processes.clear()
        atexit.unregister(self.stop)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def components(self) -> dict[str, int]:
        """Running components: name -> process id (each leads its own process group)."""
        return {process.name: process.popen.pid for process in self._processes}

    # -- helpers ----------------------------------------------------------------------------------

    def write_kubeconfig(
        self, path: Path, *, user: str, token: str | None = None, cert: Path | None = None, key: Path | None = None
    ) -> Path:
        assert self.directory is not None, "start the control plane first"
        path.parent.mkdir(parents=True, exist_ok=True)
        config = kubeconfig(self.url, self.directory / "ca.crt", user=user, token=token, cert=cert, key=key)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def logs(self, component: str, tail: int = 40) -> str:
        """The last lines a component logged (for error messages)."""
        process = next((p for p in self._processes if p.name == component), None)
        if process is None or not process.log.exists():
            return ""
        return "\n".join(process.log.read_text(errors="replace").splitlines()[-tail:])

    def _spawn(self, name: str, args: list[str]) -> None:
        assert self.directory is not None
        log = self.directory / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(
                [str(self.binaries / name), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.directory,
                start_new_session=True,
            )
        self._processes.append(_Process(name, popen, log))

    def _wait_ready(self, url: str, timeout: float, *, component: str, authenticated: bool = False) -> None:
        assert self.directory is not None
        context = ssl.create_default_context(cafile=str(self.directory / "ca.crt"))
        if authenticated:
            context.load_cert_chain(self.directory / "admin.crt", self.directory / "admin.key")
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.popen.poll() is not None:
                    raise RuntimeError(
                        f"{process.name} exited with {process.popen.returncode}:\n{self.logs(process.name)}"
                    )
            try:
                with urllib.request.urlopen(url, context=context, timeout=5) as reply:
                    if reply.status == 200:
                        return
            except (urllib.error.URLError, OSError) as error:
                last = str(error)
            time.sleep(0.25)
        raise TimeoutError(f"{component} not ready within {timeout}s ({url}: {last}):\n{self.logs(component)}")
