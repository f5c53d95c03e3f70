"""The kvtier replay policy: the production estimator and loop on what simulated pods expose."""

import json
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from kvtier.sim.policies import EqualPolicy, KvtierPolicy, Timeline, run_policy
from kvtier.sim.scenario import load_scenario
from tests.conftest import SHARED

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONVERSATION = SHARED / "traces" / "mooncake" / "mooncake_conversation_trace.jsonl"


def _phased_scenario(tmp_path, lines=1000, **extra):
    """Two tenants replaying the first ``lines`` requests (330 s) of the conversation trace, the
    second starting when the first ends: a fixed split wastes half the pool on an idle tenant."""
    if not CONVERSATION.exists():
        pytest.skip(f"trace {CONVERSATION} is absent")
    with open(CONVERSATION, encoding="utf-8") as source:
        head = [next(source) for _ in range(lines)]
    (tmp_path / "head.jsonl").write_text("".join(head))
    tenant = {
        "trace": "head.jsonl",
        "kvBytesPerToken": 327680,
        "prefillTokensPerSecond": 20000,
        "storageReadBytesPerSecond": 5e9,
    }
    path = tmp_path / "phased.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "version": 1,
                "name": "phased",
                "blockTokens": 512,
                "epochSeconds": 30,
                "scrapeSeconds": 5,
                "pool": {"capacityBlocks": 8000},
                "tenants": [{**tenant, "name": "first"}, {**tenant, "name": "second", "timeShiftSeconds": 330}],
                "policies": ["equal", "kvtier"],
                **extra,
            }
        )
    )
    return path


#: Rounds as often as the phases need (the scenario is only 660 s long).
EAGER = {"interval": "30s", "cooldown": "0s", "maxStep": 1.0}


def test_kvtier_beats_equal_by_following_the_busy_tenant(tmp_path):
    scenario = load_scenario(_phased_scenario(tmp_path, rebalance=EAGER))
    workloads = scenario.workloads()
    equal = run_policy(EqualPolicy(), scenario, workloads)
    policy, timeline = KvtierPolicy(scenario), Timeline()
    kvtier = run_policy(policy, scenario, workloads, timeline)
    assert kvtier.overall.block_hit_ratio > equal.overall.block_hit_ratio + 0.02
    assert all(sum(quotas.values()) <= 8000 for quotas in timeline.quotas)
    # Most of the pool with the first tenant while it runs, with the second once it has taken over.
    at = dict(zip(timeline.times, timeline.quotas))
    assert at[150.0]["first"] > 6000 and at[480.0]["second"] > 6000
    assert {decision.outcome for _, decision in policy.decisions} <= {"moved", "below-min-gain"}


def test_kvtier_decides_only_from_the_past(tmp_path):
    """Cutting the traces after 400 s changes no decision made before: nothing reads ahead."""
    scenario = load_scenario(_phased_scenario(tmp_path, rebalance=EAGER))
    workloads = scenario.workloads()
    cut = [type(w)(w.name, [r for r in w.requests if r.arrival < 400], w.params, w.salt, w.replicas) for w in workloads]
    whole, part = KvtierPolicy(scenario), KvtierPolicy(scenario)
    run_policy(whole, scenario, workloads)
    run_policy(part, scenario, cut)
    before = [(now, decision.target) for now, decision in whole.decisions if now <= 400]
    assert before and before == [(now, decision.target) for now, decision in part.decisions if now <= 400]


def test_a_scenario_without_rebalance_replays_the_kvpool_defaults(tmp_path):
    """One source of defaults: the KVPool model's (the CRD's), rounds at its interval, not the epoch."""
    from kvtier.api.kvpool import RebalanceSpec
    from kvtier.rebalance.loop import LoopSettings

    scenario = load_scenario(_phased_scenario(tmp_path))
    assert "rebalance" not in yaml.safe_load((tmp_path / "phased.yaml").read_text())
    policy = KvtierPolicy(scenario)
    fields = RebalanceSpec.model_fields
    spec = RebalanceSpec()
    assert policy.settings == LoopSettings.from_spec(spec) == LoopSettings()
    assert (policy.settings.policy, policy.settings.min_gain, policy.settings.max_step) == (
        fields["policy"].default,
        fields["min_gain"].default,
        fields["max_step"].default,
    )
    assert policy.settings.interval_seconds == spec.interval != scenario.epoch_seconds
    run_policy(policy, scenario)
    times = [now for now, _ in policy.decisions]
    assert times == [spec.interval * k for k in range(1, len(times) + 1)]


def test_kvtier_through_the_replay_cli_with_the_shipped_defaults(tmp_path):
    from kvtier.api.kvpool import RebalanceSpec

    spec = RebalanceSpec()
    path = _phased_scenario(tmp_path)
    out = tmp_path / "out.json"
    command = [
        sys.executable,
        "-m",
        "kvtier",
        "sim",
        "replay",
        "--scenario",
        str(path),
        "--json",
        str(out),
        "--markdown",
        str(tmp_path / "out.md"),
    ]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert re.search(r"kvtier: .*block accesses/s", done.stderr)
    policies = json.loads(out.read_text())["policies"]
    assert policies["kvtier"]["block_hit_ratio"] > policies["equal"]["block_hit_ratio"]
    assert policies["kvtier"]["gpu_prefill_seconds_saved"] > 0
    markdown = (tmp_path / "out.md").read_text()
    unit = int(re.search(r"allocation units of (\d+) blocks", markdown).group(1))
    moved = [int(units) for units in re.findall(r"\| moved \|.*?, (\d+) units,", markdown)]
    assert moved and max(moved) * unit <= spec.max_step * 8000  # maxStep of the pool a round
    times = [float(time) for time in re.findall(r"^\| (\d+) \| moved \|", markdown, re.MULTILINE)]
    assert all(later - earlier >= spec.cooldown for earlier, later in zip(times, times[1:]))


def test_the_replay_reads_the_probe_as_the_operator_reads_its_page():
    """The replay skips rendering and parsing the probe's page each scrape: the round trip is lossless."""
    from prometheus_client import CollectorRegistry, generate_latest

    from kvtier.probe.demand import DemandProbe
    from kvtier.probe.options import ProbeOptions
    from kvtier.rebalance.demand import probe_reading_of
    from kvtier.sim.policies import probe_reading
    from kvtier.sim.trace import load_trace
    from kvtier.telemetry.engines import replica_snapshot
    from kvtier.telemetry.exposition import parse_exposition

    if not CONVERSATION.exists():
        pytest.skip(f"trace {CONVERSATION} is absent")
    defaults = ProbeOptions(log_dir="")
    probe = DemandProbe(
        defaults.max_blocks,
        window_seconds=defaults.window,
        tick_seconds=defaults.tick,
        buckets_per_octave=defaults.buckets_per_octave,
    )
    registry = CollectorRegistry()
    registry.register(probe)
    requests = load_trace(CONVERSATION)[:1500]
    for index, request in enumerate(requests):
        probe.record(request.arrival, request.blocks)
        if index % 300 == 299:
            probe.advance(request.arrival + 1)
            page = replica_snapshot(probe=parse_exposition(generate_latest(registry)))
            assert probe_reading_of(page, request.arrival + 1) == probe_reading(probe, request.arrival + 1)


@pytest.mark.parametrize("max_step", [0.1, 0.5, 1.0])
def test_no_setting_lets_the_quotas_exceed_the_pool_and_shrinks_go_first(tmp_path, max_step):
    from kvtier.sim.replay import Replay

    scenario = load_scenario(_phased_scenario(tmp_path, rebalance={**EAGER, "maxStep": max_step}))
    applied: list[tuple[int, int]] = []  # (quota change, total held after it) in order
    original = Replay.set_quota

    def spy(replay, tenant, blocks):
        before = replay.quota(tenant)
        evicted = original(replay, tenant, blocks)
        applied.append((blocks - before, sum(replay.pool.quotas().values())))
        return evicted

    policy = KvtierPolicy(scenario)
    Replay.set_quota = spy
    try:
        run_policy(policy, scenario)
    finally:
        Replay.set_quota = original
    assert any(change for change, _ in applied)
    assert all(total <= scenario.capacity_blocks for _, total in applied)
    moved = [d for _, d in policy.decisions if d.outcome == "moved"]
    assert moved and all(d.moved_units <= max_step * scenario.capacity_blocks // policy.unit_blocks for d in moved)
    for decision in moved:  # the actuation order: every shrink before any grow
        grows = [change.to_units > change.from_units for change in decision.changes]
        assert grows == sorted(grows)


def test_the_replay_speed_ups_changed_no_decision():
    """Pinned before the speed-ups (issue 18): the public scenario under the replay's former rules
    (a round every epoch, the whole pool movable, no cooldown, blocks as units) gave 134,678 hit
    blocks; the faster stack distances, probe, curves and allocator give exactly the same."""
    from kvtier.api.kvpool import RebalanceSpec

    path = SHARED / "scenarios" / "three-phased.yaml"
    if not path.exists():
        pytest.skip(f"scenario {path} is absent")
    scenario = load_scenario(path)
    former = scenario.model_copy(update={"rebalance": RebalanceSpec(interval="300s", cooldown="0s", maxStep=1.0)})
    policy = KvtierPolicy(former, units=former.capacity_blocks)
    assert policy.unit_blocks == 1
    assert run_policy(policy, former).overall.hit_blocks == 134_678
