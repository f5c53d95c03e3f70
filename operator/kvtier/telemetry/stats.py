"""Per-deployment statistics over a sliding window of replica snapshots.

::

    window = DeploymentWindow(window_seconds=300, stale_seconds=60, required=REQUIRED_LMCACHE_MP)
    window.add(pod_uid, time, snapshot)      # every scrape of every replica
    summary = window.summary(now)            # -> Summary; replicas= names the pods that must report
    if materially_changed(previous, summary): ...write status...

Times are seconds on any one clock (the caller's). Each replica is reduced to a
:class:`ReplicaWindow` (counter increases, gauge statistics, latest values), and
:func:`summarise` turns those into a :class:`Summary`; the Prometheus path
(:mod:`kvtier.telemetry.promql`) builds the same ReplicaWindows from PromQL results.

Counter increases are summed step by step between successive samples; a counter that falls has
restarted and counts its new value as the increase from 0 (a histogram whose count falls or
whose bounds change restarts as a whole). A step where a series is missing is bridged from its
last value. The window starts at the newest sample at or before ``now - window_seconds``
(the baseline), so a replica needs two samples before it has increases.

Hit ratios are token-weighted over the window, over the replicas that serve both numerator and
denominator (increases summed over replicas, then divided):

- denominator ``P``: prompt tokens (``vllm:prompt_tokens``; else ``prefix_cache_queries``);
- ``hbm`` = HBM prefix-cache hit tokens / P;
- external hits ``E``: tokens vLLM loaded through the connector (``external_prefix_cache_hits``),
  else LMCache's hit tokens (``L1 + L2``, or ``lmcache_hit``);
- ``cpu`` = E x L1 / (L1 + L2) / P and ``storage`` = E x L2 / (L1 + L2) / P, with L1/L2 LMCache's
  hit tokens per tier (vLLM's count of what it loaded, split in LMCache's proportions: LMCache
  also counts lookups of requests that then wait and are looked up again); None without a split;
- ``total`` = (HBM hits + E) / P.

A ratio with no prompt tokens in the window is None (not 0).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from kvtier.probe.demand import HitCurve, hit_curve
from kvtier.telemetry.engines import COUNTERS, Buckets, Snapshot, describe

#: Series every replica must serve, per KV-cache mode (fields of :class:`Snapshot`).
REQUIRED_VLLM = ("hbm_watermark", "prompt_tokens", "prefix_cache_hits")
REQUIRED_LMCACHE_MP = (*REQUIRED_VLLM, "lmcache_hit_l1", "lmcache_hit_l2")
REQUIRED_LMCACHE_IN_PROCESS = (*REQUIRED_VLLM, "external_hits")


@dataclass(frozen=True)
class ReplicaWindow:
    """One replica over the window.

    ``seconds`` is the time the increases span (0 with one sample); ``increases`` maps each
    :data:`~kvtier.telemetry.engines.COUNTERS` field the replica serves to its increase;
    ``ttft`` holds the increase of each cumulative TTFT bucket. The watermark statistics are
    over the samples inside the window; the other fields are the newest sample's. ``stale`` is
    the reason the replica is stale, if it is.
    """

    seconds: float = 0.0
    increases: Mapping[str, float] = field(default_factory=dict)
    ttft: Buckets | None = None
    watermark_mean: float | None = None
    watermark_max: float | None = None
    storage_quota_bytes: float | None = None
    storage_used_bytes: float | None = None
    demand_chunks: Buckets | None = None
    demand_bytes: Buckets | None = None
    stale: str | None = None


@dataclass(frozen=True)
class HitRatio:
    """Share of prompt tokens served from each tier (see the module docstring)."""

    hbm: float | None = None
    cpu: float | None = None
    storage: float | None = None
    total: float | None = None


@dataclass(frozen=True)
class Summary:
    """A deployment over the window.

    ``replicas``: replicas with data in the window; ``hbm_watermark_mean`` is the mean over
    replicas of each one's mean, ``hbm_watermark_max`` the highest sample of any replica;
    ``prompt_tokens_per_second`` and ``preemptions_per_second`` are summed over replicas;
    ``storage_quota_bytes`` is the smallest replica quota (all agree once a quota change is
    applied), ``storage_used_bytes`` the sum; ``demand`` is the probe's hit curve summed over the
    fresh replicas (hits of all replicas at a per-replica capacity, in ``demand_unit``:
    ``"bytes"`` or ``"chunks"``); ``stale`` says why the statistics cannot be trusted, or None.
    ``span_seconds`` is the shortest time any replica's samples span: 0 while a replica has only
    one, when its rates and hit ratios are not known yet.
    """

    replicas: int = 0
    hbm_watermark_mean: float | None = None
    hbm_watermark_max: float | None = None
    hit_ratio: HitRatio = HitRatio()
    prompt_tokens_per_second: float | None = None
    ttft_p50_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    preemptions_per_second: float | None = None
    storage_quota_bytes: float | None = None
    storage_used_bytes: float | None = None
    demand: HitCurve | None = None
    demand_unit: str | None = None
    stale: str | None = None
    span_seconds: float = 0.0


def counter_increase(values: Iterable[float | None]) -> float | None:
    """Increase of a counter over successive values (None skipped); a fall is a restart from 0."""
    total = None
    previous = None
    for value in values:
        if value is None:
            continue
        if previous is not None:
            step = value - previous if value >= previous else value
            total = step if total is None else total + step
        previous = value
    return total


def buckets_increase(values: Iterable[Buckets | None]) -> Buckets | None:
    """Per-bucket increase of a cumulative histogram over successive values (see :func:`counter_increase`)."""
    total: list[float] | None = None
    previous: Buckets | None = None
    for value in values:
        if value is None:
            continue
        if previous is not None:
            restarted = value.bounds != previous.bounds or any(
                now < before for (_, now), (_, before) in zip(value.pairs, previous.pairs)
            )
            if restarted:
                steps = [count for _, count in value.pairs]
                if total is not None and value.bounds != previous.bounds:
                    total = None  # new buckets: the old increases cannot be added to them
            else:
                steps = [now - before for (_, now), (_, before) in zip(value.pairs, previous.pairs)]
            total = steps if total is None else [a + b for a, b in zip(total, steps)]
        previous = value
    if total is None or previous is None:
        return None
    return Buckets(tuple(zip(previous.bounds, total)))


def histogram_quantile(quantile: float, buckets: Buckets | None) -> float | None:
    """The quantile of a cumulative histogram, interpolated linearly inside its bucket (as PromQL does).

    None when the histogram is empty. A rank in the ``+Inf`` bucket gives the highest finite
    bound; the first bucket's lower bound is 0 (or its own bound when that is not positive).
    """
    if buckets is None or len(buckets.pairs) < 2 or not buckets.count > 0 or not 0 <= quantile <= 1:
        return None
    rank = quantile * buckets.count
    lower, below = 0.0, 0.0
    for index, (bound, count) in enumerate(buckets.pairs):
        if count >= rank:
            if bound == math.inf:
                return buckets.pairs[-2][0]
            if index == 0 and bound <= 0:
                return bound
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return buckets.pairs[-2][0]


def sum_buckets(histograms: Iterable[Buckets]) -> Buckets | None:
    """Histograms added bucket by bucket over the bounds they all have (``+Inf`` always among them)."""
    histograms = list(histograms)
    if not histograms:
        return None
    common = set(histograms[0].bounds).intersection(*(h.bounds for h in histograms[1:]))
    if math.inf not in common:
        return None
    totals = {bound: 0.0 for bound in common}
    for histogram in histograms:
        for bound, count in histogram.pairs:
            if bound in totals:
                totals[bound] += count
    return Buckets(tuple(sorted(totals.items())))


class DeploymentWindow:
    """Snapshots of one deployment's replicas (keyed by pod uid) over a sliding window."""

    def __init__(self, window_seconds: float, stale_seconds: float, required: Collection[str] = REQUIRED_VLLM) -> None:
        if not window_seconds > 0 or not stale_seconds > 0:
            raise ValueError("window_seconds and stale_seconds must be > 0")
        self.window_seconds = window_seconds
        self.stale_seconds = stale_seconds
        self.required = tuple(required)
        self._replicas: dict[str, deque[tuple[float, Snapshot]]] = {}

    @property
    def replica_ids(self) -> list[str]:
        return list(self._replicas)

    def add(self, uid: str, time: float, snapshot: Snapshot) -> None:
        """One scrape of one replica (a sample older than the replica's newest one is ignored).

        Only the newest sample keeps the probe's histograms: a summary reads them from it alone
        (they are instant values, not counters), and at about 8 KB a sample they were most of the
        operator's memory (5-minute windows of 1,000 replicas scraped every 15 s: 170 MB).
        """
        samples = self._replicas.setdefault(uid, deque())
        if samples and time < samples[-1][0]:
            return
        if samples:
            previous_time, previous = samples[-1]
            if previous.demand_chunks is not None or previous.demand_bytes is not None:
                samples[-1] = (previous_time, replace(previous, demand_chunks=None, demand_bytes=None))
        samples.append((time, snapshot))
        self._trim(samples, time)

    def remove(self, uid: str) -> None:
        """Forget a replica (its pod is gone and its increases should no longer count)."""
        self._replicas.pop(uid, None)

    def _trim(self, samples: deque[tuple[float, Snapshot]], now: float) -> None:
        start = now - self.window_seconds
        while len(samples) > 1 and samples[1][0] <= start:
            samples.popleft()  # the newest sample at or before the start stays as the baseline

    def replica_window(self, uid: str, now: float, lag_seconds: float = 0.0) -> ReplicaWindow | None:
        """The window of one replica at ``now``; None when it has no sample inside the window.
        ``lag_seconds``: how far the scraper itself runs late, added to the time after which it is stale."""
        samples = self._replicas.get(uid)
        if not samples:
            return None
        self._trim(samples, now)
        start = now - self.window_seconds
        used = [(time, snapshot) for time, snapshot in samples if time <= now]
        if not used or used[-1][0] <= start:
            return None
        newest_time, newest = used[-1]
        increases = {}
        for name in COUNTERS:
            increase = counter_increase(getattr(snapshot, name) for _, snapshot in used)
            if increase is not None:
                increases[name] = increase
        inside = [
            snapshot.hbm_watermark for time, snapshot in used if time > start and snapshot.hbm_watermark is not None
        ]
        return ReplicaWindow(
            seconds=newest_time - used[0][0],
            increases=increases,
            ttft=buckets_increase(snapshot.ttft for _, snapshot in used),
            watermark_mean=math.fsum(inside) / len(inside) if inside else None,
            watermark_max=max(inside) if inside else None,
            storage_quota_bytes=newest.storage_quota_bytes,
            storage_used_bytes=newest.storage_used_bytes,
            demand_chunks=newest.demand_chunks,
            demand_bytes=newest.demand_bytes,
            stale=self._stale_reason(newest_time, newest, now, lag_seconds),
        )

    def _stale_reason(self, newest_time: float, newest: Snapshot, now: float, lag_seconds: float) -> str | None:
        if now - newest_time > self.stale_seconds + lag_seconds:
            # True as it stands, and the same from cycle to cycle: a reason that moved with the lag would be
            # a material change, a status write, every cycle.
            return f"no sample in the last {self.stale_seconds:g} s"
        missing = [describe(name) for name in self.required if getattr(newest, name) is None]
        if missing:
            return "not served: " + ", ".join(missing)
        return None

    def summary(self, now: float, replicas: Iterable[str] | None = None, lag_seconds: float = 0.0) -> Summary:
        """The deployment at ``now``. ``replicas``: the pod uids that must report (default: every
        replica with a sample in the window); one of them without data makes the summary stale.
        ``lag_seconds`` as in :meth:`replica_window`."""
        windows = {}
        for uid in list(self._replicas):
            window = self.replica_window(uid, now, lag_seconds)
            if window is None and now - self._replicas[uid][-1][0] > self.window_seconds + self.stale_seconds:
                del self._replicas[uid]  # long gone
            elif window is not None:
                windows[uid] = window
        return summarise(windows, expected=replicas)


def summarise(windows: Mapping[str, ReplicaWindow], expected: Iterable[str] | None = None) -> Summary:
    """A :class:`Summary` of replica windows (keyed by replica); ``expected`` as in :meth:`DeploymentWindow.summary`."""
    reasons = [f"replica {uid}: {window.stale}" for uid, window in sorted(windows.items()) if window.stale]
    if expected is not None:
        reasons += [f"replica {uid}: no sample in the window" for uid in sorted(set(expected) - set(windows))]
    if not windows:
        reasons.append("no replica has reported metrics")
    replicas = list(windows.values())
    fresh = [window for window in replicas if window.stale is None]
    means = [window.watermark_mean for window in replicas if window.watermark_mean is not None]
    maxima = [window.watermark_max for window in replicas if window.watermark_max is not None]
    quotas = [window.storage_quota_bytes for window in fresh if window.storage_quota_bytes is not None]
    used = [window.storage_used_bytes for window in fresh if window.storage_used_bytes is not None]
    ttft = sum_buckets(window.ttft for window in replicas if window.ttft is not None)
    demand, unit = _demand(fresh)
    return Summary(
        replicas=len(replicas),
        hbm_watermark_mean=math.fsum(means) / len(means) if means else None,
        hbm_watermark_max=max(maxima) if maxima else None,
        hit_ratio=_hit_ratio(replicas),
        prompt_tokens_per_second=_rate(replicas, "prompt_tokens"),
        ttft_p50_seconds=histogram_quantile(0.5, ttft),
        ttft_p99_seconds=histogram_quantile(0.99, ttft),
        preemptions_per_second=_rate(replicas, "preemptions"),
        storage_quota_bytes=min(quotas) if quotas else None,
        storage_used_bytes=math.fsum(used) if used else None,
        demand=demand,
        demand_unit=unit,
        stale="; ".join(reasons) or None,
        span_seconds=min((window.seconds for window in replicas), default=0.0),
    )


def _rate(replicas: list[ReplicaWindow], name: str) -> float | None:
    rates = [
        window.increases[name] / window.seconds
        for window in replicas
        if window.seconds > 0 and name in window.increases
    ]
    return math.fsum(rates) if rates else None


def _tier_hits(increases: Mapping[str, float]) -> tuple[float | None, float | None, float | None, float | None]:
    """``(prompt tokens, HBM hits, external hits, L2 share of LMCache's hits)`` of one replica."""
    prompt = increases.get("prompt_tokens", increases.get("prefix_cache_queries"))
    l1, l2 = increases.get("lmcache_hit_l1"), increases.get("lmcache_hit_l2")
    lmcache = l1 + l2 if l1 is not None and l2 is not None else increases.get("lmcache_hit")
    external = increases.get("external_hits", lmcache)
    if l1 is None or l2 is None:
        share = None
    elif l1 + l2 > 0:
        share = l2 / (l1 + l2)
    else:
        share = 0.0 if external == 0 else None
    return prompt, increases.get("prefix_cache_hits"), external, share


def _hit_ratio(replicas: list[ReplicaWindow]) -> HitRatio:
    sums = {tier: [0.0, 0.0] for tier in ("hbm", "cpu", "storage", "total")}
    for window in replicas:
        prompt, hbm, external, share = _tier_hits(window.increases)
        if prompt is None:
            continue
        hits = {
            "hbm": hbm,
            "cpu": external * (1 - share) if external is not None and share is not None else None,
            "storage": external * share if external is not None and share is not None else None,
            "total": hbm + external if hbm is not None and external is not None else None,
        }
        for tier, value in hits.items():
            if value is not None:
                sums[tier][0] += value
                sums[tier][1] += prompt
    ratios = {tier: hits / prompt if prompt > 0 else None for tier, (hits, prompt) in sums.items()}
    return HitRatio(**ratios)


def _demand(replicas: list[ReplicaWindow]) -> tuple[HitCurve | None, str | None]:
    for unit, name in (("bytes", "demand_bytes"), ("chunks", "demand_chunks")):
        histograms = [getattr(window, name) for window in replicas]
        if histograms and all(histogram is not None for histogram in histograms):
            total = sum_buckets(histograms)
            if total is not None:
                try:
                    return hit_curve(total.pairs), unit
                except ValueError:
                    return None, None
    return None, None


@dataclass(frozen=True)
class Tolerances:
    """How far a summary may move before it is worth writing: ``ratio`` absolute for watermarks and
    hit ratios, ``relative`` for the other numbers (a share of the larger value)."""

    ratio: float = 0.01
    relative: float = 0.05


#: Summary fields compared by :func:`materially_changed`, by tolerance.
_RATIOS = ("hbm_watermark_mean", "hbm_watermark_max")
_RELATIVE = (
    "prompt_tokens_per_second",
    "ttft_p50_seconds",
    "ttft_p99_seconds",
    "preemptions_per_second",
    "storage_used_bytes",
)
_EXACT = ("replicas", "storage_quota_bytes", "stale")


def materially_changed(old: Summary | None, new: Summary, tolerances: Tolerances = Tolerances()) -> bool:
    """Whether ``new`` differs from ``old`` enough to write it (the demand curve is not compared).

    A number appearing or disappearing, a different replica count, quota or stale reason is
    always material; other numbers beyond their tolerance.
    """
    if old is None:
        return True
    if any(getattr(old, name) != getattr(new, name) for name in _EXACT):
        return True
    pairs = [(getattr(old, name), getattr(new, name), False) for name in _RATIOS]
    pairs += [
        (getattr(old.hit_ratio, tier), getattr(new.hit_ratio, tier), False)
        for tier in ("hbm", "cpu", "storage", "total")
    ]
    pairs += [(getattr(old, name), getattr(new, name), True) for name in _RELATIVE]
    for before, after, relative in pairs:
        if (before is None) != (after is None):
            return True
        if before is None:
            continue
        limit = tolerances.relative * max(abs(before), abs(after)) if relative else tolerances.ratio
        if abs(after - before) > limit:
            return True
    return False
