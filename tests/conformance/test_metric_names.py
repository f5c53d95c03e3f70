"""Every vLLM and LMCache metric name kvtier's scraper reads is registered by the installed vLLM 0.33 / LMCache 0.5.6.

vLLM and in-process LMCache register prometheus_client metrics by name (`name="vllm:prefix_cache_queries"`); the
LMCache MP server registers OpenTelemetry instruments (`"lmcache_mp.lookup_requested"`, `unit="tokens"`), which
its Prometheus exporter spells with underscores and the unit appended (`lmcache_mp_lookup_requested_tokens`).
Counters read without `_total` here (the scraper reads both spellings). The live page itself is checked in
test_lmcache_server.py.
"""

from __future__ import annotations

import re

import pytest

from kvtier.telemetry import engines as names

pytestmark = pytest.mark.conformance

#: Everything the scraper looks up, by snapshot field.
READ = {
    field: spellings
    for field, spellings in names.SOURCES.items()
    if any(s.startswith(("vllm:", "lmcache:", "lmcache_mp_")) for s in spellings)
}
#: Older vLLM spellings the scraper still reads for clusters on vLLM < 0.11; 0.33 no longer registers them.
LEGACY = {"vllm:gpu_cache_usage_perc", "vllm:gpu_prefix_cache_queries", "vllm:gpu_prefix_cache_hits"}
#: `meter.create_counter("lmcache_mp.x", ..., unit="tokens")` and `register_gauge(meter, "lmcache_mp.x", ...)`.
INSTRUMENT = re.compile(r'"(lmcache_mp\.[a-z0-9_]+)"(?P<rest>(?:(?!"lmcache_mp\.).){0,800})', re.S)
UNIT = re.compile(r'\bunit="([^"]*)"')


def prometheus_name(instrument: str, unit: str) -> str:
    """The OpenTelemetry Prometheus exporter's spelling of an instrument (without a counter's `_total`)."""
    name = instrument.replace(".", "_")
    unit = unit.replace("/", "_per_")
    return name if not unit or name.endswith(f"_{unit}") else f"{name}_{unit}"


@pytest.fixture(scope="module")
def registered(engines):
    """Names the installed packages register: prometheus_client names as written, OTel ones as exported."""
    found = set()
    for package in ("vllm", "lmcache"):
        for text in engines.source(package).values():
            found |= set(re.findall(r'"((?:vllm|lmcache):[a-z0-9_:]+)"', text))
            for match in INSTRUMENT.finditer(text):
                unit = UNIT.search(match["rest"])
                found.add(prometheus_name(match[1], unit[1] if unit else ""))
    return found


def unregistered(read: dict[str, list[str]], registered: set[str]) -> dict[str, list[str]]:
    """The engine names in `read` (by snapshot field) that the installed packages do not register."""
    missing = {
        field: [
            s
            for s in spellings
            if s.startswith(("vllm:", "lmcache:", "lmcache_mp_")) and s not in LEGACY and s not in registered
        ]
        for field, spellings in read.items()
    }
    return {field: spellings for field, spellings in missing.items() if spellings}


def test_every_name_the_scraper_reads_is_registered(registered):
    missing = unregistered(READ, registered)
    assert not missing, f"the scraper reads names the installed engines no longer register: {missing}"


@pytest.mark.parametrize(
    "broken",
    ["vllm:prefix_cache_hit", "lmcache_mp_lookup_hit_tokens_totals", "lmcache:num_hit_token"],
    ids=["vllm-singular", "mp-misspelled-unit", "lmcache-singular"],
)
def test_a_misspelled_name_is_caught(registered, broken):
    """The check above, shown catching one deliberately broken name per engine face."""
    field = next(iter(READ))
    assert unregistered({**READ, field: [*READ[field], broken]}, registered) == {field: [broken]}


def test_the_legacy_spellings_are_really_gone_from_vllm_033(registered):
    assert LEGACY.isdisjoint(registered), "a legacy spelling is still registered: it is no longer legacy"
    assert LEGACY <= {s for spellings in READ.values() for s in spellings}


def test_the_mp_names_carry_their_units(registered):
    """Defect 3 of issue 17: the MP counters are exported with their unit; the unitless spellings do not exist."""
    for unitless in (
        "lmcache_mp_lookup_requested",
        "lmcache_mp_lookup_hit",
        "lmcache_mp_lookup_hit_l1",
        "lmcache_mp_lookup_hit_l2",
        "lmcache_mp_lookups",
    ):
        assert unitless not in registered
    assert {
        "lmcache_mp_lookup_requested_tokens",
        "lmcache_mp_lookup_hit_l2_tokens",
        "lmcache_mp_lookups_requests",
        "lmcache_mp_l1_memory_usage_bytes",
        "lmcache_mp_l2_usage_bytes",
    } <= registered
