"""An in-process Kubernetes API server with real semantics, for tests, demos and benchmarks.

    async with APIServer() as server:          # or: with ThreadedAPIServer() as server:
        server.write_kubeconfig(path)          # for kubectl, the kubernetes client, kopf
        server.faults.add(verb="patch", resource="pods", status=409, times=2)
        server.faults.add(verb="watch", resource="widgets", drop_watch_after=0.5)
        server.close_watches("pods")           # drop the open pod watches now
        server.requests.filter(verb="watch", resource="pods")

In-process access (on the server's loop; from another thread through `ThreadedAPIServer.call`):
`server.cluster.resource(group, version, plural)` gives a ResourceType for `cluster.create`,
`get`, `list`, `update`, `patch`, `apply`, `delete`.  Tests get the `apiserver`, `kubeconfig`,
`api` and `kubectl` fixtures of tests/integration/conftest.py.

Modules: :mod:`.core` (semantics), :mod:`.store` (storage, watches), :mod:`.resources` (types,
discovery), :mod:`.schema`, :mod:`.crds` and :mod:`.defaults` (validation, defaulting),
:mod:`.patch` and :mod:`.apply` (PATCH flavours, server-side apply), :mod:`.table` and
:mod:`.printers` (kubectl columns), :mod:`.openapi`, :mod:`.protobuf` (the few protobuf bodies
kubectl sends), :mod:`.faults`, :mod:`.http` (routing), :mod:`.server` (lifecycle, kubeconfig).
"""

from .core import Cluster, WriteOptions
from .errors import StatusError
from .faults import FaultInjector, FaultRule, RequestLog, RequestRecord
from .server import APIServer, ThreadedAPIServer, write_kubeconfig

__all__ = [
    "APIServer",
    "Cluster",
    "FaultInjector",
    "FaultRule",
    "RequestLog",
    "RequestRecord",
    "StatusError",
    "ThreadedAPIServer",
    "WriteOptions",
    "write_kubeconfig",
]
