"""Trace loading: units, scaling, shifting, namespaces, errors."""

import json

import pytest

from kvtier.sim.trace import NAMESPACE_BITS, Request, iter_trace, load_trace, namespaced


def _write(path, records):
    path.write_text("\n".join(json.dumps(r) if isinstance(r, dict) else r for r in records) + "\n")
    return path


def test_milliseconds_scale_and_shift(tmp_path):
    trace = _write(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 2000, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]},
            "",
            {"timestamp": 1000, "input_length": 100, "output_length": 1, "hash_ids": [0]},
        ],
    )
    assert list(iter_trace(trace)) == [Request(2.0, 600, 5, (0, 1)), Request(1.0, 100, 1, (0,))]
    shifted = load_trace(trace, time_scale=0.5, time_shift_seconds=10)
    assert [r.arrival for r in shifted] == [10.5, 11.0]  # sorted by arrival


def test_seconds_and_namespaces(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [{"timestamp": 3, "input_length": 1, "output_length": 1, "hash_ids": [7]}])
    (request,) = load_trace(trace, timestamp_unit="s", namespace=2)
    assert request.arrival == 3.0
    assert request.blocks == (namespaced(7, 2),) == ((2 << NAMESPACE_BITS) | 7,)


def test_ties_keep_file_order(tmp_path):
    records = [{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [i]} for i in range(5)]
    trace = _write(tmp_path / "t.jsonl", records)
    assert [r.blocks[0] for r in load_trace(trace)] == list(range(5))


@pytest.mark.parametrize(
    "line",
    [
        "{not json",
        json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1}),
        json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [-1]}),
        json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1.5]}),
        json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [2**NAMESPACE_BITS]}),
        json.dumps({"timestamp": "x", "input_length": 1, "output_length": 1, "hash_ids": [1]}),
    ],
)
def test_a_malformed_record_names_file_and_line(tmp_path, line):
    good = json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]})
    trace = _write(tmp_path / "bad.jsonl", [good, line])
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: "):
        load_trace(trace)


def test_bad_arguments(tmp_path):
    trace = _write(tmp_path / "t.jsonl", [])
    with pytest.raises(ValueError):
        list(iter_trace(trace, timestamp_unit="us"))  # type: ignore[arg-type]  # an unknown unit on purpose
    with pytest.raises(ValueError):
        list(iter_trace(trace, namespace=-1))
