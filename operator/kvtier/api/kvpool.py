"""KVPool: a budget of fast flash (an NVMe-oF array, a CSI StorageClass, or a host path) shared by deployments."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from kvtier.api.common import (
    API_VERSION,
    DNS_SUBDOMAIN_PATTERN,
    Condition,
    KubeModel,
    ObjectMeta,
    SecretReference,
    Timestamp,
)
from kvtier.api.errors import FieldProblem
from kvtier.api.rules import Rule, cel_rules
from kvtier.api.units import Duration, Quantity, unless_malformed

#: NVMe Qualified Name: `nqn.<yyyy-mm>.<reverse domain>[:<anything>]`, at most 223 bytes (NVMe base spec 4.5).
NQN_PATTERN = r"^nqn\.[0-9]{4}-(0[1-9]|1[0-2])\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*(:.+)?$"
#: Lowercase, as Kubernetes writes identifiers: so the API server's list-map key check finds duplicates too.
UUID_PATTERN = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
#: Most namespaces of one static pool. The uniqueness rule below compares every pair (standard CEL has no
#: set); at 512 its estimated cost fits a real API server's per-rule budget (measured on v1.37: 1024 is 3.7x over).
MAX_NAMESPACES = 512
#: The list-map key compares uuids as written; this rule compares them ignoring case, as `nvme` tools and the
#: model do. Standard macros only (`lowerAscii` is in the strings library of every Kubernetes with CEL rules).
UNIQUE_UUIDS_RULE = "self.map(n, n.uuid.lowerAscii()).all(u, self.exists_one(m, m.uuid.lowerAscii() == u))"
UNIQUE_UUIDS_MESSAGE = "duplicate namespace uuid: each uuid names one namespace of the array (compared ignoring case)"
HOST_PATTERN = r"^(\[[0-9A-Fa-f:.]+\]|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*|[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?)$"

NQN = Field(max_length=223, pattern=NQN_PATTERN)


class NVMeoFTarget(KubeModel):
    """One transport address of the array's NVMe-oF subsystems."""

    address: str = Field(min_length=1, max_length=253, pattern=HOST_PATTERN)
    """IP address or DNS name of a target port (traddr)."""
    port: int = Field(default=4420, ge=1, le=65535)
    """Transport service id (trsvcid); 4420 is the NVMe-oF default."""


class NVMeoFNamespace(KubeModel):
    """One namespace of the array's static inventory; each is bound to at most one replica."""

    nqn: str = NQN
    """NQN of the subsystem that exports the namespace (one subsystem per namespace is the safe layout)."""
    uuid: str = Field(pattern=UUID_PATTERN, max_length=36)
    """Namespace UUID, in lowercase (`nvme id-ns` prints it so); becomes the PersistentVolume's volumeHandle and
    deviceUUID. Unique within the pool."""
    size: Quantity
    """Usable bytes of the namespace; caps the storage quota of the replica bound to it."""


class NVMeoFAuth(KubeModel):
    """DH-HMAC-CHAP credentials, referenced and never copied into status, logs or Events."""

    secret_ref: SecretReference
    """Secret with keys `dhchapSecret` (host key) and optionally `dhchapCtrlSecret` (controller key)."""


class NVMeoFConnect(KubeModel):
    """Host connect options (`nvme connect`); applied only by drivers that accept them."""

    ctrl_loss_tmo: int | None = Field(default=None, ge=-1, le=2**31 - 1)
    """Seconds to keep retrying a lost controller (`-l`; -1 retries forever; kernel default 600)."""
    reconnect_delay: int | None = Field(default=None, ge=1, le=2**31 - 1)
    """Seconds between reconnect attempts (`-c`; kernel default 10)."""
    nr_io_queues: int | None = Field(default=None, ge=1, le=1024, alias="nrIOQueues")
    """Number of I/O queues (`-i`)."""
    queue_size: int | None = Field(default=None, ge=16, le=1024)
    """I/O queue depth (`-Q`; kernel default 128)."""


class NVMeoFStorage(KubeModel):
    """Static inventory on an NVMe-over-Fabrics array, attached through a CSI node driver."""

    driver: str = Field(default="csi.nvmf.com", min_length=1, max_length=63)
    """CSI driver name (default `csi.nvmf.com`: kubernetes-csi/csi-driver-nvmf, which connects one path, no auth)."""
    transport: Literal["tcp", "rdma"] = "tcp"
    """NVMe-oF transport the hosts connect with: `tcp` (default) or `rdma`."""
    targets: list[NVMeoFTarget] = Field(min_length=1, max_length=16)
    """The array's target ports (1 to 16); every namespace is reached through them."""
    namespaces: list[NVMeoFNamespace] = Field(
        min_length=1,
        max_length=MAX_NAMESPACES,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["uuid"],
            **cel_rules(Rule(UNIQUE_UUIDS_RULE, UNIQUE_UUIDS_MESSAGE)),
        },
    )
    """The static inventory kvtier may bind, one namespace per replica, in this order (at most 512; uuids unique,
    compared ignoring case)."""
    host_nqn: str | None = Field(default=None, alias="hostNQN", max_length=223, pattern=NQN_PATTERN)
    """NQN this cluster's hosts present to the array (required with `auth`)."""
    auth: NVMeoFAuth | None = None
    """DH-HMAC-CHAP authentication (optional; needs hostNQN)."""
    connect: NVMeoFConnect | None = None
    """Host connect options (optional; the kernel's defaults otherwise)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "!has(self.auth) || has(self.hostNQN)",
                "hostNQN is required when auth is set: DH-HMAC-CHAP authenticates a host NQN",
                field_path=".hostNQN",
                reason="FieldValueRequired",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> NVMeoFStorage:
        if self.auth is not None and self.host_nqn is None:
            raise FieldProblem("hostNQN", "hostNQN is required when auth is set: DH-HMAC-CHAP authenticates a host NQN")
        seen: set[str] = set()
        for index, namespace in enumerate(self.namespaces):
            key = namespace.uuid.lower()
            if key in seen:
                raise FieldProblem(f"namespaces.{index}.uuid", f"duplicate namespace uuid {namespace.uuid}")
            seen.add(key)
        return self


class CSIStorage(KubeModel):
    """Dynamic provisioning through any CSI driver's StorageClass (Lightbits, Trident, PowerStore ...)."""

    storage_class_name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)
    """StorageClass that provisions one volume per replica, sized to the deployment's storage `max`."""
    volume_mode: Literal["Block", "Filesystem"] = "Block"
    """`Block` for LMCache's raw-block tier; `Filesystem` for in-process `local_disk`."""


class HostPathStorage(KubeModel):
    """A directory on every node holding one pre-sized file per replica (development and kind only)."""

    path: str = Field(min_length=2, max_length=4096, pattern=r"^/")
    """Absolute directory on every node; kvtier keeps one subdirectory per replica under it."""


class PoolStorage(KubeModel):
    """Where the pool's bytes live: exactly one backend."""

    nvmeof: NVMeoFStorage | None = None
    """Static namespaces on an NVMe-over-Fabrics array."""
    csi: CSIStorage | None = None
    """Volumes provisioned on demand through a CSI StorageClass."""
    host_path: HostPathStorage | None = None
    """A directory on every node (development and kind only)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "(has(self.nvmeof) ? 1 : 0) + (has(self.csi) ? 1 : 0) + (has(self.hostPath) ? 1 : 0) == 1",
                "set exactly one storage backend: nvmeof, csi or hostPath",
            ),
        )
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> PoolStorage:
        chosen = [name for name in ("nvmeof", "csi", "host_path") if getattr(self, name) is not None]
        if len(chosen) != 1:
            raise ValueError("set exactly one storage backend: nvmeof, csi or hostPath")
        return self

    @property
    def backend(self) -> Literal["nvmeof", "csi", "hostPath"]:
        if self.nvmeof is not None:
            return "nvmeof"
        return "csi" if self.csi is not None else "hostPath"


RebalancePolicy = Literal["Static", "Proportional", "MarginalGain"]


class RebalanceSpec(KubeModel):
    """How often and how boldly the pool's capacity is re-divided between its deployments."""

    policy: RebalancePolicy = "MarginalGain"
    """`Static` keeps each deployment at its request; `Proportional` divides by weight x demand;
    `MarginalGain` divides by the prefill work each byte saves, from measured demand curves."""
    interval: Duration = Field(default="1m", validate_default=True)
    """How often a new division is computed, a duration (default 1m, at least 1s)."""
    cooldown: Duration = Field(default="1m", validate_default=True)
    """Least time between two moves of the same pool, a duration (default 1m: a move every default interval;
    measured with bench/rebalance_sweep.py, a longer cooldown loses hits on every phased workload)."""
    min_gain: float = Field(default=0.01, ge=0, le=1)
    """Least predicted relative improvement of the pool's objective (prefill work saved) that justifies a
    move (default 0.01 = 1%; 0 to 1)."""
    max_step: float = Field(default=0.5, gt=0, le=1)
    """Largest fraction of the pool's capacity moved in one round (default 0.5 = 50%; above 0, at most 1)."""
    dry_run: bool = False
    """Compute and report moves (Events, status.lastRebalance) without applying them (default false)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "!has(self.interval) || "
                + unless_malformed("duration(self.interval) >= duration('1s')", durations=("self.interval",)),
                "interval must be at least 1s",
                field_path=".interval",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> RebalanceSpec:
        if self.interval < 1:
            raise FieldProblem("interval", "interval must be at least 1s")
        return self


class RecommendationSpec(KubeModel):
    """How the operator sizes the pool for its deployments' measured demand (`status.recommendation`)."""

    interval: Duration = Field(default="5m", validate_default=True)
    """How often the recommendation is recomputed from the deployments' published demand curves, a duration
    (default 5m, at least 1s); it is written only when it changed materially."""
    min_gain_per_doubling: float = Field(default=0.02, gt=0, le=1)
    """The recommended capacity is the smallest capacity from which doubling the pool (and every further
    doubling) would raise the pool's predicted hit ratio by less than this (default 0.02 = 2 percentage points;
    above 0, at most 1)."""
    undersized_margin: float = Field(default=0.25, ge=0, le=10)
    """The pool is undersized while the recommended capacity exceeds the capacity by more than this fraction
    (default 0.25: a recommendation above 1.25x the capacity; 0 to 10)."""
    undersized_refreshes: int = Field(default=3, ge=1, le=100)
    """Consecutive refreshes that must agree before the pool is declared undersized (a Warning Event,
    `PoolUndersized`) or recovered (a Normal Event, `PoolSized`) (default 3; 1 to 100)."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                "!has(self.interval) || "
                + unless_malformed("duration(self.interval) >= duration('1s')", durations=("self.interval",)),
                "interval must be at least 1s",
                field_path=".interval",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> RecommendationSpec:
        if self.interval < 1:
            raise FieldProblem("interval", "interval must be at least 1s")
        return self


VolumeReclaim = Literal["Wipe", "Retain"]


class KVPoolSpec(KubeModel):
    """The pool's capacity, where its bytes live, and how it is re-divided between deployments."""

    capacity: Quantity
    """Bytes the pool may hand out to deployments, a quantity such as 10Ti (the sum of every deployment's
    quota x replicas never exceeds it). Must be greater than zero."""
    read_bandwidth: Quantity | None = None
    """Bytes per second one replica can read from the pool, a quantity such as 12500M (advisory: recorded for
    people and capacity planning; this version's rebalancer does not read it)."""
    write_bandwidth: Quantity | None = None
    """Bytes per second one replica can write to the pool, a quantity (advisory, like readBandwidth)."""
    storage: PoolStorage
    rebalance: RebalanceSpec = Field(default_factory=RebalanceSpec, json_schema_extra={"default": {}})
    recommendation: RecommendationSpec = Field(default_factory=RecommendationSpec, json_schema_extra={"default": {}})
    """How often and by what threshold the operator recommends a capacity (`status.recommendation`)."""
    volume_reclaim: VolumeReclaim = "Wipe"
    """What becomes of a static volume (an NVMe-oF namespace's PersistentVolume, a hostPath directory) once
    no deployment uses it any more (the deployment was deleted or scaled down), before the namespace
    can be bound again. `Wipe`: a short Job in the operator's namespace binds the volume and discards
    (`blkdiscard`, else zeroes) the device, or deletes the cache files of a hostPath directory; only
    when it succeeds is the PersistentVolume deleted and the namespace free. A failed wipe keeps the
    namespace out of use and says so in the pool's Degraded condition (delete the failed Job to retry).
    `Retain`: the PersistentVolume stays `Released` with the previous tenant's data and the namespace
    is not bound again until an administrator deletes that PersistentVolume. Changing the setting
    applies to volumes still waiting (switching to Wipe wipes the retained ones). Dynamic CSI volumes
    follow their StorageClass' reclaimPolicy instead."""

    model_config = ConfigDict(
        json_schema_extra=cel_rules(
            Rule(
                unless_malformed(
                    "quantity(string(self.capacity)).isGreaterThan(quantity('0'))", quantities=("self.capacity",)
                ),
                "capacity must be greater than zero",
                field_path=".capacity",
            ),
        )
    )

    @model_validator(mode="after")
    def _check(self) -> KVPoolSpec:
        if self.capacity <= 0:
            raise FieldProblem("capacity", "capacity must be greater than zero")
        return self


class QuotaMove(KubeModel):
    """One deployment's per-replica storage quota before and after a rebalance."""

    namespace: str
    """Namespace of the InferenceDeployment."""
    name: str
    """Name of the InferenceDeployment."""
    from_quota: Quantity
    """Per-replica storage quota before the move."""
    to_quota: Quantity
    """Per-replica storage quota after the move."""


#: Bound of the status lists: deployments (or moves) per pool. Bounded lists keep the CEL cost of their
#: quantities within a real API server's budget (an unbounded list is estimated at ~3MB of items).
STATUS_LIST_LIMIT = 1024


class RebalanceRecord(KubeModel):
    """The last round that moved capacity (or, with dryRun, would have)."""

    time: Timestamp
    """When the round decided."""
    moved_bytes: Quantity
    """Bytes of quota that changed hands, over all replicas."""
    predicted_gain: float
    """Predicted relative improvement of the pool's objective (0.05 = 5% more prefill work saved)."""
    reason: str
    """Why the round moved, in words."""
    dry_run: bool = False
    """True when the moves were only reported (spec.rebalance.dryRun)."""
    moves: list[QuotaMove] = Field(default_factory=list, max_length=STATUS_LIST_LIMIT)
    """Each deployment whose quota changed."""


class Allocation(KubeModel):
    """One deployment's share of the pool: the ledger entry, written before anything is actuated."""

    namespace: str
    """Namespace of the InferenceDeployment."""
    name: str
    """Name of the InferenceDeployment."""
    uid: str
    """UID of the InferenceDeployment (a deployment recreated under the same name is a new tenant)."""
    replicas: int = Field(ge=0)
    """Replicas admitted (each holds `quota` and, in a static pool, one namespace)."""
    quota: Quantity
    """Storage quota per replica."""
    volumes: list[str] = Field(default_factory=list)
    """Static NVMe-oF pools: the namespace UUID bound to each ordinal, in ordinal order."""

    @property
    def allocated(self) -> int:
        return self.quota * self.replicas


class WaitingDeployment(KubeModel):
    """A deployment the pool could not admit yet; admitted in `since` order when capacity frees up."""

    namespace: str
    """Namespace of the InferenceDeployment."""
    name: str
    """Name of the InferenceDeployment."""
    uid: str
    """UID of the InferenceDeployment."""
    since: Timestamp
    """When it started waiting."""
    needs: Quantity
    """Bytes it needs at its minimum: `min` x replicas."""
    passed_over: int = Field(default=0, ge=0)
    """Newer deployments admitted ahead of it because it did not fit the free capacity (bounded)."""


class CapacityPoint(KubeModel):
    """What the pool would earn at one capacity, divided between its deployments as the rebalancer divides it."""

    factor: float
    """The capacity as a multiple of the current one (0.5, 1 or 2)."""
    capacity: Quantity
    """The capacity planned."""
    hit_ratio: float
    """Predicted share of the deployments' looked-up blocks the pool would serve (0 to 1)."""
    gpu_seconds_saved_per_hour: float
    """Predicted GPU prefill seconds the hits would save per hour, at the published prompt rates."""
    read_bytes_per_second: Quantity
    """Bytes per second the hits would read from the pool (mean)."""
    saturated: bool | None = None
    """Whether those reads exceed the pool's read bandwidth (`spec.readBandwidth` x replicas); unset when
    `spec.readBandwidth` is not."""


class PoolRecommendation(KubeModel):
    """The capacity plan in short, computed as `kvtier plan --live` computes it (docs/capacity-planning.md)."""

    observed_at: Timestamp
    """When this recommendation was computed (it is rewritten only on a material change)."""
    capacity: Quantity
    """spec.capacity the recommendation was computed for."""
    recommended_capacity: Quantity | None = None
    """The smallest capacity from which doubling raises the predicted hit ratio by less than
    `spec.recommendation.minGainPerDoubling`; unset while no deployment publishes a demand curve."""
    reason: str = ""
    """Why that capacity, in words."""
    saturated: bool | None = None
    """Whether reads at the recommended capacity would exceed the pool's read bandwidth; unset when
    `spec.readBandwidth` is not."""
    points: list[CapacityPoint] = Field(default_factory=list, max_length=8)
    """Hit ratio, savings and reads at 0.5x, 1x and 2x the current capacity (a point below the deployments'
    minimums is left out)."""
    deployments: int = 0
    """Deployments whose demand curves were planned."""
    without_curve: int = 0
    """Deployments on the pool left out: they publish no demand curve yet."""
    undersized: bool = False
    """The pool has been undersized (recommendation above capacity x (1 + undersizedMargin)) for
    `undersizedRefreshes` refreshes in a row, and has not recovered for as many."""
    streak: int = Field(default=0, ge=0)
    """Refreshes in a row whose finding disagreed with `undersized` (it flips when this reaches
    `undersizedRefreshes`)."""


class KVPoolStatus(KubeModel):
    """What the operator observed; written by kvtier through the status subresource, never by users."""

    observed_generation: int | None = None
    """The `metadata.generation` this status describes; while it lags, the operator has not acted on the
    latest spec yet."""
    capacity: Quantity | None = None
    """spec.capacity as the operator last applied it."""
    allocated: Quantity | None = None
    """Bytes handed out: the sum of every deployment's quota x replicas."""
    available: Quantity | None = None
    """Bytes not handed out: capacity minus allocated."""
    deployments: int | None = None
    """Number of InferenceDeployments holding a share of the pool."""
    conditions: list[Condition] = Field(default_factory=list)
    """Ready, OverCommitted and Degraded, each with a reason and a message."""
    last_rebalance: RebalanceRecord | None = None
    recommendation: PoolRecommendation | None = None
    """The capacity the deployments' measured demand calls for, and what 0.5x, 1x and 2x would earn
    (refreshed every `spec.recommendation.interval`, written on material change)."""
    allocations: list[Allocation] = Field(default_factory=list, max_length=STATUS_LIST_LIMIT)
    """The ledger: every deployment's share. The sum of `quota` x `replicas` never exceeds `capacity`."""
    waiting: list[WaitingDeployment] = Field(default_factory=list, max_length=STATUS_LIST_LIMIT)
    """Deployments waiting for capacity, oldest first."""
    reclaiming: list[str] = Field(default_factory=list)
    """Static NVMe-oF namespaces (UUIDs) no deployment holds any more that are not free yet: being wiped,
    or retained until their PersistentVolume is deleted (`spec.volumeReclaim`)."""


class KVPool(KubeModel):
    """A KV storage pool: capacity on a flash array that kvtier divides between InferenceDeployments."""

    KIND: ClassVar[str] = "KVPool"
    PLURAL: ClassVar[str] = "kvpools"

    api_version: Literal["kvtier.io/v1alpha1"] = API_VERSION
    kind: Literal["KVPool"] = "KVPool"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: KVPoolSpec
    status: KVPoolStatus | None = None
    """What the operator observed: capacity handed out, the ledger, conditions and the last rebalance."""
