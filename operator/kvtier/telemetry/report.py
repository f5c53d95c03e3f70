"""What the operator says about a deployment's telemetry: ``status.kv``, ``MetricsAvailable``, Events.

Pure functions over a :class:`~kvtier.telemetry.stats.Summary`:

- :func:`kv_status`: the summary as the wire form of ``status.kv`` (without ``storage.quota``,
  which the reconcile writes from the pool's ledger); :func:`written_summary` reads the numbers
  back, so a restarted operator compares with what the object says instead of writing it again;
- :func:`metrics_condition`: ``MetricsAvailable`` as ``(status, reason, message)``;
- :class:`Alerts`: Events worth posting as the summaries go by (the watermark staying above a
  threshold, the hit ratio falling).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from kvtier.api.units import counted, format_quantity, parse_quantity
from kvtier.telemetry.stats import HitRatio, Summary

#: Digits kept in status numbers (the rest is noise, and would make every write "material").
DIGITS = 4
#: Points of the demand curve written to status.
DEMAND_POINTS = 8


def _round(value: float | None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, DIGITS)


def _ratio(value: float | None) -> float | None:
    value = _round(value)
    return None if value is None else min(1.0, max(0.0, value))


def _drop_none(mapping: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in mapping.items() if value is not None and value != {}}


def demand_points(summary: Summary, count: int = DEMAND_POINTS) -> dict[str, Any] | None:
    """Up to ``count`` points of the demand curve, spread over its capacities (the last one included)."""
    curve = summary.demand
    if curve is None or not curve.capacities or not curve.total or summary.demand_unit not in ("bytes", "chunks"):
        return None
    capacities = curve.capacities
    step = max(1, math.ceil(len(capacities) / count))
    chosen = list(capacities[step - 1 :: step])[:count]
    if chosen[-1] != capacities[-1]:
        chosen[-1] = capacities[-1]
    points = [{"capacity": round(c), "hitRatio": _ratio(curve.hit_ratio(c))} for c in chosen]
    return {"unit": summary.demand_unit, "points": points}


def kv_status(summary: Summary, sampled_at: datetime | None = None) -> dict[str, Any]:
    """``status.kv`` (camelCase, rounded; absent numbers left out, so a merge patch keeps the old ones)."""
    hit = summary.hit_ratio
    used = summary.storage_used_bytes
    return _drop_none(
        {
            "hbmWatermark": _ratio(summary.hbm_watermark_mean),
            "hbmWatermarkMax": _ratio(summary.hbm_watermark_max),
            "hitRatio": _drop_none({tier: _ratio(getattr(hit, tier)) for tier in ("hbm", "cpu", "storage", "total")}),
            "ttftP50Seconds": _round(summary.ttft_p50_seconds),
            "ttftP99Seconds": _round(summary.ttft_p99_seconds),
            "preemptionsPerSecond": _round(summary.preemptions_per_second),
            "promptTokensPerSecond": _round(summary.prompt_tokens_per_second),
            "storage": {"used": format_quantity(int(used))} if used is not None and math.isfinite(used) else None,
            "demand": demand_points(summary),
            "sampledAt": (sampled_at or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "shown": _drop_none(
                {
                    "hbmWatermark": percent(_ratio(summary.hbm_watermark_mean)),
                    "hitRatio": percent(_ratio(hit.total)),
                    "storageHitRatio": percent(_ratio(hit.storage)),
                    "ttftP50": seconds(summary.ttft_p50_seconds),
                }
            ),
        }
    )


def written_summary(kv: Any, like: Summary) -> Summary | None:
    """The numbers a ``status.kv`` that :func:`kv_status` wrote says, as a summary that matches ``like`` in
    what the wire form does not carry (replica count, quota, stale reason); None without ``sampledAt``
    (no telemetry wrote it) or when a number in it does not read."""
    if not isinstance(kv, dict) or not kv.get("sampledAt"):
        return None
    hit, storage = kv.get("hitRatio") or {}, kv.get("storage") or {}
    if not isinstance(hit, dict) or not isinstance(storage, dict):
        return None
    fields = {
        "hbm_watermark_mean": kv.get("hbmWatermark"),
        "hbm_watermark_max": kv.get("hbmWatermarkMax"),
        "ttft_p50_seconds": kv.get("ttftP50Seconds"),
        "ttft_p99_seconds": kv.get("ttftP99Seconds"),
        "preemptions_per_second": kv.get("preemptionsPerSecond"),
        "prompt_tokens_per_second": kv.get("promptTokensPerSecond"),
        **{tier: hit.get(tier) for tier in ("hbm", "cpu", "storage", "total")},
    }
    numbers = {name: as_number(value) for name, value in fields.items()}
    if any(value is not None and numbers[name] is None for name, value in fields.items()):
        return None
    try:
        used = float(parse_quantity(storage["used"])) if storage.get("used") is not None else None
    except ValueError:
        return None
    return replace(
        like,
        hbm_watermark_mean=numbers["hbm_watermark_mean"],
        hbm_watermark_max=numbers["hbm_watermark_max"],
        hit_ratio=HitRatio(*(numbers[tier] for tier in ("hbm", "cpu", "storage", "total"))),
        ttft_p50_seconds=numbers["ttft_p50_seconds"],
        ttft_p99_seconds=numbers["ttft_p99_seconds"],
        preemptions_per_second=numbers["preemptions_per_second"],
        prompt_tokens_per_second=numbers["prompt_tokens_per_second"],
        storage_used_bytes=used,
    )


def as_number(value: Any) -> float | None:
    """A JSON number as a float; None for anything else (booleans included)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def percent(ratio: float | None) -> str | None:
    """`0.923` -> `92%`; below 10% one decimal (`4.5%`), so a small share does not read as none."""
    if ratio is None:
        return None
    return f"{ratio:.1%}" if 0 < ratio < 0.1 else f"{ratio:.0%}"


def seconds(value: float | None) -> str | None:
    """`0.85` -> `850ms`, `1.5` -> `1.5s`, `15.2` -> `15.2s`, `152.3` -> `152s`."""
    if value is None or not math.isfinite(value):
        return None
    if value < 1:
        return f"{value * 1000:.0f}ms"
    return f"{value:.3g}s" if value < 100 else f"{value:.0f}s"


def metrics_condition(
    summary: Summary | None, ready_replicas: int, failures: Sequence[str] = ()
) -> tuple[str, str, str]:
    """``MetricsAvailable``: True when every Ready replica reports fresh metrics; False saying why
    when scrapes fail or the numbers are stale; Unknown while there is nothing to scrape yet.

    ``failures`` are this cycle's failed scrapes or queries (``"pod: endpoint: reason: detail"``).
    """
    if ready_replicas == 0:
        return "Unknown", "NoReadyReplicas", "no Ready replica to scrape"
    if failures:
        shown = "; ".join(failures[:5]) + (f"; and {len(failures) - 5} more" if len(failures) > 5 else "")
        return "False", "ScrapeFailed", shown
    if summary is None:
        return "Unknown", "NotScrapedYet", "waiting for the first scrape"
    if summary.stale:
        return "False", "MetricsStale", summary.stale
    return "True", "MetricsFresh", f"{counted(summary.replicas, 'replica')} reporting"


@dataclass(frozen=True)
class AlertRules:
    """When :class:`Alerts` speaks up."""

    watermark_threshold: float = 0.9
    """Mean HBM watermark at or above which a deployment is short of GPU KV cache ..."""
    watermark_seconds: float = 300.0
    """... once it has stayed there this long."""
    hit_ratio_drop: float = 0.2
    """A fall of the total hit ratio by this much (absolute) below its recent peak."""


class Alerts:
    """Per deployment: turns successive summaries into ``(type, reason, message)`` Events, each once."""

    def __init__(self, rules: AlertRules = AlertRules()) -> None:
        self.rules = rules
        self._high_since: float | None = None
        self._high_reported = False
        self._peak: float | None = None

    def observe(self, now: float, summary: Summary) -> list[tuple[str, str, str]]:
        events = []
        rules = self.rules
        watermark = summary.hbm_watermark_mean
        if watermark is not None and watermark >= rules.watermark_threshold:
            if self._high_since is None:
                self._high_since = now
            if not self._high_reported and now - self._high_since >= rules.watermark_seconds:
                self._high_reported = True
                events.append(
                    (
                        "Warning",
                        "HBMWatermarkHigh",
                        f"GPU KV cache {watermark:.0%} full (>= {rules.watermark_threshold:.0%} for "
                        f"{now - self._high_since:.0f}s): requests queue or are preempted",
                    )
                )
        elif watermark is not None:
            if self._high_reported:
                events.append(
                    (
                        "Normal",
                        "HBMWatermarkNormal",
                        f"GPU KV cache {watermark:.0%} full, below {rules.watermark_threshold:.0%} again",
                    )
                )
            self._high_since, self._high_reported = None, False
        total = summary.hit_ratio.total
        if total is not None and summary.stale is None:
            if self._peak is None or total > self._peak:
                self._peak = total
            elif self._peak - total >= rules.hit_ratio_drop:
                events.append(
                    (
                        "Warning",
                        "HitRatioFell",
                        f"cache hit ratio fell from {self._peak:.0%} to {total:.0%} of prompt tokens",
                    )
                )
                self._peak = total
        return events
