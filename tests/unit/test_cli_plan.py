"""`kvtier plan`: the acceptance command, the --trace source, JSON, the plot, and errors that name the option."""

import json
import subprocess
import sys

from tests.conftest import EXAMPLES, SHARED

SCENARIO = SHARED / "scenarios" / "three-phased.yaml"
PRICES = EXAMPLES / "prices-fx100.yaml"
TRACES = SHARED / "traces" / "mooncake"


def kvtier_plan(*args):
    return subprocess.run([sys.executable, "-m", "kvtier", "plan", *map(str, args)], capture_output=True, text=True)


def test_acceptance_command_prints_the_table_a_pick_and_a_readable_plot(tmp_path):
    plot = tmp_path / "plan.png"
    result = kvtier_plan("--scenario", SCENARIO, "--target-hit-ratio", "0.3", "--prices", PRICES, "--plot", plot)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:4] == ["capacity", "x", "now", "block"]
    assert any(line.startswith("pick: ") and "block hit ratio" in line and ">= 0.3" in line for line in lines)
    assert "FX100" in result.stdout and "conv quota / block / token" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_json_pick_is_the_smallest_capacity_meeting_the_target():
    result = kvtier_plan("--scenario", SCENARIO, "--target-hit-ratio", "0.3", "--prices", PRICES, "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    rows = plan["capacities"]
    picked = next(row for row in rows if row["capacity_blocks"] == plan["pick"]["capacity_blocks"])
    assert picked["block_hit_ratio"] >= 0.3
    assert all(row["block_hit_ratio"] < 0.3 for row in rows if row["capacity_blocks"] < picked["capacity_blocks"])
    assert plan["current"]["capacity_blocks"] == 13531 and plan["currency"] == "CNY"
    assert {
        "gpu_prefill_seconds_saved_per_hour",
        "ttft_p50_seconds",
        "ttft_p99_seconds",
        "saturated",
        "read_bytes_per_second_peak_minute",
        "price_per_saved_gpu_hour",
    } <= set(picked)
    assert set(picked["per_tenant"]) == {"conv", "synA", "synB"}


def test_trace_source_with_explicit_capacities_and_an_unreachable_target():
    result = kvtier_plan(
        "--trace",
        f"chat={TRACES / 'mooncake_conversation_trace.jsonl'}",
        "--trace",
        TRACES / "mooncake_synthetic_trace.jsonl",
        "--capacity",
        "1Ti",
        "--capacities",
        "512Gi,1Ti",
        "--target-hit-ratio",
        "0.99",
        "--read-bandwidth",
        "1G",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert [row["capacity_bytes"] // plan["block_bytes"] for row in plan["capacities"]] == [
        2**39 // plan["block_bytes"],
        2**40 // plan["block_bytes"],
    ]
    assert set(plan["capacities"][0]["per_tenant"]) == {"chat", "mooncake_synthetic_trace"}
    assert plan["pick"]["capacity_blocks"] is None and "no capacity tried meets" in plan["pick"]["reason"]
    assert all(row["saturated"] for row in plan["capacities"])  # 1 GB/s cannot carry these reads


def test_errors_name_the_option():
    both = kvtier_plan("--scenario", SCENARIO, "--trace", "x.jsonl")
    assert both.returncode == 2 and "exactly one source" in both.stderr
    bad = kvtier_plan("--scenario", SCENARIO, "--capacities", "lots")
    assert bad.returncode == 2 and "--capacities" in bad.stderr and "Traceback" not in bad.stderr
    no_capacity = kvtier_plan("--trace", TRACES / "mooncake_synthetic_trace.jsonl")
    assert no_capacity.returncode == 2 and "--capacity" in no_capacity.stderr
