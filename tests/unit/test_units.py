"""Quantities and durations parse like Kubernetes and Go do, and write back exactly."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.api.units import format_duration, format_quantity, gib, parse_duration, parse_quantity, quantity_value


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10Ti", 10 * 2**40),
        ("500Gi", 500 * 2**30),
        ("12500000000", 12_500_000_000),
        (12500000000, 12_500_000_000),
        ("1.5Gi", 1536 * 2**20),
        ("5G", 5_000_000_000),
        ("1k", 1000),
        ("0", 0),
        ("0.5", 1),  # rounded up, like resource.Quantity.Value()
    ],
)
def test_parse_quantity(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text", ["-1", "10TB", "1e3", "500m", "Gi", "", " ", "1.Gi", True, None, [1], -3, float("nan")]
)
def test_parse_quantity_rejects(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=2**62))
def test_format_quantity_round_trips(value):
    assert parse_quantity(format_quantity(value)) == value


def test_format_quantity_prefers_binary_suffixes():
    assert format_quantity(10 * 2**40) == "10Ti"
    assert format_quantity(5_000_000_000) == "5G"
    assert format_quantity(12345) == "12345"


def test_quantity_value_reads_the_whole_kubernetes_grammar():
    assert str(quantity_value("500m")) == "0.500"
    assert quantity_value("1e3") == 1000
    assert quantity_value("-2Ki") == -2048
    assert quantity_value("+.5") * 2 == 1
    with pytest.raises(ValueError):
        quantity_value("5 Gi")


def test_gib_is_the_plain_float_lmcache_expects():
    assert gib(parse_quantity("200Gi")) == 200.0
    assert gib(parse_quantity("1.5Gi")) == 1.5


@pytest.mark.parametrize(
    ("text", "seconds"), [("60s", 60), ("5m", 300), ("1h30m", 5400), ("1.5s", 1.5), ("500ms", 0.5), (30, 30)]
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["60", "5 m", "-5s", "1d", "", "s", True, None])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@given(st.integers(min_value=0, max_value=10**7))
def test_format_duration_round_trips(millis):
    assert parse_duration(format_duration(millis / 1000)) == pytest.approx(millis / 1000)


def test_counts_in_words():
    from kvtier.api.units import counted

    assert [counted(n, "deployment") for n in (0, 1, 3)] == ["no deployment", "1 deployment", "3 deployments"]
    assert counted(2, "replica") == "2 replicas" and counted(2, "index", "indices") == "2 indices"
