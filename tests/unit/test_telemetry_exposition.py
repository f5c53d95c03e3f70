"""The exposition parser: adversarial pages keep exactly the samples they should, bounds, round trips."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.exposition import generate_latest

from kvtier.telemetry.exposition import parse_exposition


def found(page):
    """Every sample as ``{(name, labels): repr(value)}`` (repr: NaN equals NaN)."""
    return {(s.name, tuple(sorted(s.labels.items()))): repr(s.value) for s in page}


def want(*samples):
    return {(name, tuple(sorted(labels.items()))): repr(float(value)) for name, labels, value in samples}


NAN, INF = math.nan, math.inf

# (id, body, samples that must survive with their exact values, line numbers of the problems)
CASES = [
    ("plain gauge", "x 1\n", [("x", {}, 1)], []),
    (
        "colon names",
        'vllm:kv_cache_usage_perc{engine="0"} 0.25\n',
        [("vllm:kv_cache_usage_perc", {"engine": "0"}, 0.25)],
        [],
    ),
    (
        "counter with help and type",
        '# HELP a_total Requests.\n# TYPE a_total counter\na_total{model_name="m",engine="0"} 42\n',
        [("a_total", {"model_name": "m", "engine": "0"}, 42)],
        [],
    ),
    ("NaN", "g NaN\n", [("g", {}, NAN)], []),
    ("infinities", "a +Inf\nb -Inf\nc Inf\n", [("a", {}, INF), ("b", {}, -INF), ("c", {}, INF)], []),
    ("exponents", "a 1.5e3\nb 2E-2\nc -3.25e+1\n", [("a", {}, 1500), ("b", {}, 0.02), ("c", {}, -32.5)], []),
    ("timestamps", 'a 7 1712345678000\nb{x="1"} 8 -5\n', [("a", {}, 7), ("b", {"x": "1"}, 8)], []),
    (
        "escapes in label values",
        'a{p="q\\"uote",b="back\\\\slash",n="new\\nline"} 3\n',
        [("a", {"p": 'q"uote', "b": "back\\slash", "n": "new\nline"}, 3)],
        [],
    ),
    ("commas braces and = inside quotes", 'a{v="x,y}{=z",w="}"} 4\n', [("a", {"v": "x,y}{=z", "w": "}"}, 4)], []),
    ("hash inside a label value", 'a{v="# not a comment"} 5\n', [("a", {"v": "# not a comment"}, 5)], []),
    (
        "no help and no type",
        'a_total 1\na_bucket{le="+Inf"} 2\n',
        [("a_total", {}, 1), ("a_bucket", {"le": "+Inf"}, 2)],
        [],
    ),
    ("type after its samples", "a 1\n# TYPE a gauge\n", [("a", {}, 1)], []),
    ("duplicate series keeps the first", 'a{x="1"} 1\na{x="1"} 2\n', [("a", {"x": "1"}, 1)], [2]),
    ("duplicate with labels reordered", 'a{x="1",y="2"} 1\na{y="2",x="1"} 9\n', [("a", {"x": "1", "y": "2"}, 1)], [2]),
    (
        "same labels, other name is no duplicate",
        'a{x="1"} 1\nb{x="1"} 2\n',
        [("a", {"x": "1"}, 1), ("b", {"x": "1"}, 2)],
        [],
    ),
    ("truncated final line is dropped", "a 1\nb 1234", [("a", {}, 1)], [2]),
    ("truncated inside labels", 'a 1\nb{x="1', [("a", {}, 1)], [2]),
    ("NUL byte in a name", "a 1\nb\x00c 2\nd 3\n", [("a", {}, 1), ("d", {}, 3)], [2]),
    ("NUL byte in a value", "a 1\x00\nd 3\n", [("d", {}, 3)], [1]),
    ("garbage lines between samples", "a 1\n}}}{{{\n=== 5\nb 2\n\x01\x02\n", [("a", {}, 1), ("b", {}, 2)], [2, 3, 5]),
    ("empty body", "", [], []),
    ("only comments", "# HELP a x\n# TYPE a gauge\n# just a comment\n", [], []),
    ("CRLF line ends", 'a 1\r\nb{x="y"} 2\r\n', [("a", {}, 1), ("b", {"x": "y"}, 2)], []),
    ("tabs and spaces", '  a \t 1\nb{ x = "1" , y="2" }\t2\t100\n', [("a", {}, 1), ("b", {"x": "1", "y": "2"}, 2)], []),
    ("trailing comma in labels", 'a{x="1",} 1\n', [("a", {"x": "1"}, 1)], []),
    ("empty braces", "a{} 3\n", [("a", {}, 3)], []),
    ("unterminated quote does not swallow the page", 'a{x="1} 1\nb 2\n', [("b", {}, 2)], [1]),
    ("repeated label name", 'a{x="1",x="2"} 1\nb 2\n', [("b", {}, 2)], [1]),
    ("label without quotes", "a{x=1} 1\nb 2\n", [("b", {}, 2)], [1]),
    ("labels without a comma", 'a{x="1" y="2"} 1\nb 2\n', [("b", {}, 2)], [1]),
    ("underscore in a number", "a 1_000\nb 2\n", [("b", {}, 2)], [1]),
    ("value is not a number", "a abc\nb 0x10\nc 2\n", [("c", {}, 2)], [1, 2]),
    ("missing value", 'a{x="1"}\nb\nc 2\n', [("c", {}, 2)], [1, 2]),
    ("bad timestamp", "a 1 soon\nb 1 NaN\nc 2\n", [("c", {}, 2)], [1, 2]),
    (
        "OpenMetrics exemplar and EOF",
        'a_bucket{le="1"} 3 # {trace_id="t"} 0.5 1\n# EOF\n',
        [("a_bucket", {"le": "1"}, 3)],
        [],
    ),
    (
        "extremes",
        "a 1.7976931348623157e308\nb -0.0\nc 5e-324\n",
        [("a", {}, 1.7976931348623157e308), ("b", {}, -0.0), ("c", {}, 5e-324)],
        [],
    ),
    (
        "old and new vLLM names side by side",
        "vllm:gpu_cache_usage_perc 0.5\nvllm:kv_cache_usage_perc 0.5\nvllm:gpu_prefix_cache_hits_total 7\n",
        [
            ("vllm:gpu_cache_usage_perc", {}, 0.5),
            ("vllm:kv_cache_usage_perc", {}, 0.5),
            ("vllm:gpu_prefix_cache_hits_total", {}, 7),
        ],
        [],
    ),
    (
        "histogram",
        '# TYPE h histogram\nh_bucket{le="0.1"} 1\nh_bucket{le="+Inf"} 3\nh_sum 0.7\nh_count 3\n',
        [("h_bucket", {"le": "0.1"}, 1), ("h_bucket", {"le": "+Inf"}, 3), ("h_sum", {}, 0.7), ("h_count", {}, 3)],
        [],
    ),
    ("unicode label values", 'a{v="ü→✓"} 1\n', [("a", {"v": "ü→✓"}, 1)], []),
    ("metric name starting with a digit", "1a 1\nb 2\n", [("b", {}, 2)], [1]),
    ("malformed TYPE line", "# TYPE a\n# TYPE b sometype\nb 1\n", [("b", {}, 1)], [1, 2]),
]


@pytest.mark.parametrize(
    ("body", "samples", "problem_lines"), [case[1:] for case in CASES], ids=[case[0] for case in CASES]
)
def test_adversarial_pages(body, samples, problem_lines):
    for form in (body, body.encode()):
        page = parse_exposition(form)
        assert found(page) == want(*samples)
        assert [problem.line for problem in page.problems] == problem_lines
        assert page.series == len(samples)
        assert not page.truncated


def test_timestamps_are_kept():
    page = parse_exposition("a 7 1712345678000\n")
    assert page.samples_of("a")[0].timestamp == 1712345678000.0
    assert parse_exposition("a 7\n").samples_of("a")[0].timestamp is None


def test_types_are_recorded_wherever_they_appear():
    page = parse_exposition("a 1\n# TYPE a gauge\n# TYPE b_total counter\n# TYPE a counter\n")
    assert page.types == {"a": "gauge", "b_total": "counter"}
    assert [problem.line for problem in page.problems] == [4]  # a conflicting second TYPE


def test_invalid_utf8_is_replaced_and_reported():
    page = parse_exposition(b'a 1\nb{v="\xff\xfe"} 2\n\xc3 3\nc 4\n')
    assert found(page) == want(("a", {}, 1), ("b", {"v": "\ufffd\ufffd"}, 2), ("c", {}, 4))
    assert [problem.line for problem in page.problems] == [2, 3]
    assert "UTF-8" in page.problems[0].message


def test_sum_matches_labels():
    page = parse_exposition('c_total{engine="0",s="a"} 1\nc_total{engine="1",s="a"} 2\nc_total{engine="1",s="b"} 4\n')
    assert page.sum("c_total") == 7
    assert page.sum("c_total", s="a") == 3
    assert page.sum("c_total", engine="1", s="b") == 4
    assert page.sum("c_total", s="z") is None
    assert page.sum("absent") is None


def test_byte_limit_reads_whole_lines_only():
    body = "".join(f"m{index} {index}\n" for index in range(100))
    limit = body.index("m10 ") + 2  # cuts into line 11
    page = parse_exposition(body, max_bytes=limit)
    assert page.truncated
    assert found(page) == want(*((f"m{index}", {}, index) for index in range(10)))
    assert page.problems[0].line == 0 and "limit" in page.problems[0].message


def test_byte_limit_cut_inside_a_multibyte_character_is_not_a_utf8_problem():
    body = "a 1\n" + 'b{v="é"} 2\n'
    page = parse_exposition(body.encode(), max_bytes=len('a 1\nb{v="') + 1)
    assert found(page) == want(("a", {}, 1))
    assert [problem.line for problem in page.problems] == [0]


def test_series_limit_stops_and_reports():
    body = "".join(f"m{index} {index}\n" for index in range(50))
    page = parse_exposition(body, max_series=20)
    assert page.truncated and page.series == 20
    assert found(page) == want(*((f"m{index}", {}, index) for index in range(20)))
    assert page.problems[-1].line == 21


def test_not_a_page():
    assert parse_exposition(None).problems[0].message == "empty page"
    assert parse_exposition(12).problems[0].message == "not a page: int"  # type: ignore[arg-type]  # garbage on purpose


def test_pathological_input_is_linear():
    """Long runs that would make a backtracking regex explode are rejected quickly."""
    body = "a{" + 'x="' * 20_000 + "\n" + "b{" + "a" * 50_000 + " 1\n" + "c " + " " * 50_000 + "\nd 4\n"
    page = parse_exposition(body)
    assert found(page) == want(("d", {}, 4))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_never_raise(body):
    page = parse_exposition(body)
    for sample in page:
        assert isinstance(sample.value, float)


LINE_PIECES = st.sampled_from(
    [
        "a",
        "{",
        "}",
        '"',
        "\\",
        ",",
        "=",
        " ",
        "\t",
        "\n",
        "#",
        "TYPE",
        "HELP",
        "1",
        ".",
        "e",
        "-",
        "+Inf",
        "NaN",
        "le",
        ":",
        "\x00",
        "\r",
        "é",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(LINE_PIECES, max_size=200))
def test_random_exposition_fragments_never_raise(pieces):
    body = "".join(pieces)
    page = parse_exposition(body)
    assert page.series == sum(len(samples) for samples in page.samples.values())


METRIC_NAME = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True).filter(
    lambda name: not name.endswith(("_total", "_created", "_bucket", "_count", "_sum", "_info"))
)
LABEL_NAME = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,10}", fullmatch=True)
LABEL_VALUE = st.text(max_size=12)
VALUE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(10**15), 10**15))


@st.composite
def registries(draw):
    registry = CollectorRegistry()
    names = draw(st.lists(METRIC_NAME, min_size=1, max_size=6, unique_by=lambda name: name.replace(":", "_")))
    for name in names:
        labels = draw(st.lists(LABEL_NAME, max_size=3, unique=True))
        counter = draw(st.booleans())
        family = (Counter if counter else Gauge)(name, "doc \\ with \n escapes", labels, registry=registry)
        for _ in range(draw(st.integers(1, 4)) if labels else 1):
            child = family.labels(*(draw(LABEL_VALUE) for _ in labels)) if labels else family
            if counter:
                child.inc(abs(draw(st.floats(0, 1e12))))
            else:
                child.set(draw(VALUE))
    return registry


@settings(max_examples=150, deadline=None)
@given(registries())
def test_generate_latest_round_trips_exactly(registry):
    body = generate_latest(registry)
    expected = {
        (sample.name, tuple(sorted(sample.labels.items()))): repr(float(sample.value))
        for family in registry.collect()
        for sample in family.samples
    }
    page = parse_exposition(body)
    assert page.problems == []
    assert found(page) == expected


def test_only_the_names_asked_for_are_read_and_garbage_is_still_reported():
    body = (
        "# TYPE skipped_total counter\n"
        'skipped_total{a="1"} 5\n'
        "skipped 7\n"
        "skipped\t8\n"
        'kept{b="2"} 1\n'
        "kept_total 2\n"
        "kept 3\n"
        "bad{ 4\n"  # not one of the names, but not a sample either: reported
        "@garbage\n"
    )
    page = parse_exposition(body, names={"kept", "kept_total", "bad"})
    assert found(page) == want(("kept", {"b": "2"}, 1), ("kept_total", {}, 2), ("kept", {}, 3))
    assert page.series == 3
    assert page.types == {"skipped_total": "counter"}  # TYPE lines are always read
    assert [problem.line for problem in page.problems] == [8, 9]
    unfiltered = parse_exposition(body)
    assert found(unfiltered) == {**found(page), **want(("skipped_total", {"a": "1"}, 5), ("skipped", {}, 7))}
    assert [problem.line for problem in unfiltered.problems] == [4, 8, 9]  # the repeated `skipped`
    assert parse_exposition("x 1\n", names=()).series == 0 and not parse_exposition("x 1\n", names=()).problems
