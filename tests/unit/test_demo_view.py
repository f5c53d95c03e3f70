"""`kvtier demo` without a cluster: its manifests validate, its load takes turns, and its view and
summary render what the operator reports (every field, and none)."""

from datetime import UTC, datetime

from click.testing import CliRunner
from rich.console import Console

from kvtier.cli import main
from kvtier.demo.manifests import DEPLOYMENTS, DemoManifests
from kvtier.demo.observe import snapshot
from kvtier.demo.report import History, summary_markdown
from kvtier.demo.view import MISSING, Clock, plain_line, render
from kvtier.demo.workload import PHASES, Workload
from kvtier.sim.trace import iter_trace

POOL = {
    "apiVersion": "kvtier.io/v1alpha1",
    "kind": "KVPool",
    "metadata": {"name": "demo-pool"},
    "spec": {
        "capacity": "96Gi",
        "storage": {"hostPath": {"path": "/var/lib/kvtier"}},
        "rebalance": {"policy": "MarginalGain", "interval": "5s"},
    },
    "status": {
        "capacity": "96Gi",
        "allocated": "96Gi",
        "available": "0",
        "allocations": [
            {"namespace": "kvtier-demo", "name": "chat", "uid": "u1", "replicas": 1, "quota": "56Gi"},
            {"namespace": "kvtier-demo", "name": "code", "uid": "u2", "replicas": 1, "quota": "20Gi"},
        ],
        "lastRebalance": {
            "time": "2026-12-03T10:00:05Z",
            "movedBytes": "24Gi",
            "predictedGain": 0.125,
            "reason": "chat's curve is steepest",
            "moves": [
                {"namespace": "kvtier-demo", "name": "chat", "fromQuota": "32Gi", "toQuota": "56Gi"},
                {"namespace": "kvtier-demo", "name": "code", "fromQuota": "32Gi", "toQuota": "20Gi"},
            ],
        },
    },
}


def deployment(name, status=None):
    return {
        "apiVersion": "kvtier.io/v1alpha1",
        "kind": "InferenceDeployment",
        "metadata": {"name": name, "namespace": "kvtier-demo"},
        "spec": {
            "replicas": 1,
            "kvCache": {"storage": {"poolRef": "demo-pool", "request": "32Gi", "min": "8Gi", "max": "64Gi"}},
        },
        **({"status": status} if status is not None else {}),
    }


FULL = deployment(
    "chat",
    {
        "replicas": 1,
        "readyReplicas": 1,
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady", "message": "1/1"}],
        "kv": {
            "hbmWatermark": 0.83,
            "hitRatio": {"hbm": 0.27, "cpu": 0.12, "storage": 0.215, "total": 0.605},
            "storage": {"quota": "32Gi", "used": "30Gi"},
            "ttftP50Seconds": 0.42,
            "sampledAt": "2026-12-03T10:00:04Z",
            "promptTokensPerSecond": 20000,
        },
    },
)
PARTIAL = deployment("code", {"replicas": 1, "readyReplicas": 0, "kv": {"storage": {"quota": "32Gi"}}})
BARE = deployment("rag")
EVENTS = [
    {
        "metadata": {"resourceVersion": "7"},
        "involvedObject": {"kind": "KVPool", "name": "demo-pool"},
        "type": "Normal",
        "reason": "Rebalanced",
        "message": "chat 32Gi -> 56Gi",
        "lastTimestamp": "2026-12-03T10:00:05Z",
    },
    {
        "metadata": {"resourceVersion": "3"},
        "involvedObject": {"kind": "InferenceDeployment", "name": "chat"},
        "type": "Normal",
        "reason": "AllReplicasReady",
        "message": "1/1 replicas ready",
        "lastTimestamp": "2026-12-03T10:00:01Z",
    },
    {
        "metadata": {"resourceVersion": "4"},
        "involvedObject": {"kind": "Pod", "name": "chat-0"},
        "type": "Normal",
        "reason": "Started",
        "message": "not ours",
    },
]


def screen(renderable) -> str:
    console = Console(record=True, width=180, color_system=None)
    console.print(renderable)
    return console.export_text()


def test_the_packaged_manifests_validate_and_carry_the_load(tmp_path):
    manifests = DemoManifests(trace="/tmp/kvtier demo/load.jsonl", speed=20)
    path = tmp_path / "demo.yaml"
    path.write_text(manifests.render())
    result = CliRunner().invoke(main, ["validate", "-f", str(path)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("4 kvtier objects valid")

    objects = manifests.objects()
    assert [o["kind"] for o in objects] == ["KVPool", "Namespace", *["InferenceDeployment"] * 3]
    assert objects[0]["spec"]["rebalance"]["policy"] == "MarginalGain"
    assert objects[0]["spec"]["rebalance"]["interval"] == "5s"
    shifts = []
    for body in objects[2:]:
        env = {item["name"]: item["value"] for item in body["spec"]["engine"]["env"]}
        assert env["KVSIM_TRACE"] == "/tmp/kvtier demo/load.jsonl" and env["KVSIM_SPEED"] == "20"
        assert env["KVSIM_LOOP"] == "true"
        shifts.append(float(env["KVSIM_TIME_SHIFT"]))
    assert [o["metadata"]["name"] for o in objects[2:]] == list(DEPLOYMENTS)
    assert len(set(shifts)) == 3


def test_the_load_makes_each_deployment_busy_in_turn(tmp_path):
    workload = Workload()
    trace = tmp_path / "load.jsonl"
    workload.write(trace)
    requests = list(iter_trace(trace))
    assert requests[-1].arrival == workload.cycle_seconds - 1  # a looping replay restarts one cycle later
    assert all(len(r.blocks) * workload.block_tokens == r.input_tokens for r in requests)
    for index in range(PHASES):
        shift = workload.time_shift(index)
        # Replayed arrivals in the first cycle (the loop continues from the last one, + 1 s).
        first = [r.arrival + shift for r in requests if r.arrival + shift >= 0]
        wrapped = [a + workload.cycle_seconds for a in (r.arrival + shift for r in requests) if a < 0]
        counts = [
            sum(
                1 for a in first + wrapped if phase * workload.phase_seconds <= a < (phase + 1) * workload.phase_seconds
            )
            for phase in range(PHASES)
        ]
        assert max(range(PHASES), key=counts.__getitem__) == index, counts
        assert counts[index] > 3 * max(c for p, c in enumerate(counts) if p != index)


def test_the_view_shows_every_reported_field():
    state = snapshot(POOL, [FULL, PARTIAL, BARE], EVENTS)
    chat = state.deployments[0]
    assert chat.quota == 56 << 30 and chat.applied_quota == 32 << 30  # the ledger wins over the applied quota
    ready_at = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC).timestamp()
    text = screen(render(state, Clock("running", 12, 60, 10, busy="chat", hint="Ctrl-C stops", origin=ready_at)))
    for expected in (
        "1/1",
        "83.0%",
        "27.0%",
        "12.0%",
        "21.5%",
        "60.5%",
        "420ms",
        "56Gi",
        "8Gi–64Gi",
        "30Gi",
        "capacity 96Gi, allocated 96Gi, available 0",
        "MarginalGain every 5s",
        "last rebalance at 5s: moved 24Gi: chat 32Gi→56Gi, code 32Gi→20Gi (chat's curve is steepest)",
        "1s InferenceDeployment/chat AllReplicasReady",
        "12s / 1m",
        "simulated 2m (10x)",
        "busy now: chat",
        "Rebalanced",
        "Ctrl-C stops",
    ):
        assert expected in text, expected
    assert "Started" not in text  # only Events about kvtier's objects
    assert text.index("AllReplicasReady") < text.index("Rebalanced")  # oldest first

    line = plain_line(state, Clock("running", 12, 60, 10, busy="chat"))
    assert "chat 1/1 quota 56Gi wm 83.0% hit 60.5%" in line and "rebalance events 1" in line


def test_the_view_shows_a_dash_for_what_is_not_reported():
    state = snapshot(None, [PARTIAL, BARE])
    text = screen(render(state, Clock("starting", 3, 60, 10)))
    assert "pool — (not created yet)" in text and "last rebalance: —" in text
    rows = {line.split("│")[1].strip(): line for line in text.splitlines() if line.count("│") > 5}
    assert rows["code"].count(MISSING) >= 7 and "32Gi" in rows["code"] and "0/1" in rows["code"]
    assert "—/1" in rows["rag"] and "8Gi–64Gi" in rows["rag"]
    assert "waiting for the deployments' replicas to be Ready" in text
    assert plain_line(state, Clock("starting", 3, 60, 10)).startswith("[starting 3s] | pool —/—")
    assert "(no deployments yet)" in screen(render(snapshot(None, []), Clock("starting", 0, 60, 10)))


def test_the_summary_reports_quota_moves_and_hit_ratios():
    before = snapshot(
        {**POOL, "status": {"capacity": "96Gi"}},
        [
            deployment("chat", {"kv": {"storage": {"quota": "32Gi"}}}),
            deployment("code", {"kv": {"storage": {"quota": "32Gi"}}}),
        ],
    )
    history = History(speed=10)
    ready_at = datetime(2026, 12, 3, 10, 0, 0, tzinfo=UTC).timestamp()
    history.add(0, before, busy="chat", at=ready_at)
    history.add(1, snapshot(POOL, [FULL, PARTIAL], EVENTS), busy="chat", at=ready_at + 1)
    history.add(6, snapshot(POOL, [FULL, PARTIAL], EVENTS), busy="chat", at=ready_at + 6)
    history.add(7, snapshot(POOL, [FULL, PARTIAL], EVENTS), busy="code", at=ready_at + 7)
    text = summary_markdown(history, window=20)
    # One form of time (seconds since Ready), and what the quota bought in tokens per second, not a bare gain.
    assert "| 5s | 24Gi | chat 32Gi→56Gi, code 32Gi→20Gi | chat's curve is steepest |" in text
    assert "2026-12-03T" not in text and "predicted gain" not in text
    assert "| 0s–7s | chat | 32Gi → 56Gi | — → 20.0k | — → 4.3k | — → 21.5% | — → 60.5% |" in text
    assert "its working set grew" in text and "20s telemetry window" in text
    assert "| chat | 32Gi | 56Gi | +24Gi | 8Gi | 64Gi |" in text
    assert "| code | 32Gi | 20Gi | −12Gi |" in text
    assert "2 quota changes observed, 1 rebalance round recorded" in text and "1 rebalance Event." in text
    assert "chat 32Gi→56Gi, code 32Gi→20Gi" in text
    assert "| chat | 27.0% / 27.0% |" in text and "| code | — | — | — | — | — |" in text

    quiet = History(speed=10)
    quiet.add(0, snapshot(None, [BARE]))
    text = summary_markdown(quiet, plot=None)
    assert "No quota moved" in text and "No hit ratios were reported" in text


def test_the_plot_explains_itself_with_legends_beside_the_data():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from kvtier.demo.report import plot_figure

    history = History(speed=10)
    for second in range(30):
        history.add(second, snapshot(POOL, [FULL, PARTIAL], EVENTS), busy="chat" if second < 15 else "code")
    figure = plot_figure(history)
    renderer = FigureCanvasAgg(figure).get_renderer()
    quota_axes, served_axes, hit_axes = figure.axes[:3]
    labels = [text.get_text() for text in quota_axes.get_legend().get_texts()]
    assert labels == [
        "chat",
        "code",
        "pool capacity",
        "the load's busy deployment\n(shaded in its colour)",
        "a quota change\n(a rebalance round)",
    ]
    assert "tokens per second served from each deployment's storage tier" in served_axes.get_title(loc="left")
    assert [line.get_label() for line in served_axes.get_lines()] == ["chat"]  # 0.215 x 20000 tokens/s
    assert served_axes.get_lines()[0].get_ydata()[-1] == 0.215 * 20000 / 1000
    assert "the load changed, not its quota" in hit_axes.get_title(loc="left")
    for axes in (quota_axes, served_axes, hit_axes):  # every legend right of its axes, never over the data
        legend_box = axes.get_legend().get_window_extent(renderer)
        assert legend_box.x0 >= axes.get_window_extent(renderer).x1
