"""Manifests are read as kubectl reads them (go-yaml's plain scalars, then the API server's JSON numbers)."""

import pytest

from kvtier.api.documents import load_all


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1e-400", 0),  # PyYAML: the string "1e-400"; go-yaml: 0.0, sent as 0
        ("1e3", 1000),  # PyYAML: a string
        ("1.0", 1),  # json.Marshal(1.0) is "1": an integer to the server
        ("1.5", 1.5),
        ("9223372036854775807", 2**63 - 1),
        ("9223372036854775808", 9.223372036854776e18),  # beyond int64: a float64 to the server
        ("1" + "0" * 400, "1" + "0" * 400),  # beyond float64: go-yaml keeps the string
        ("1e400", "1e400"),
        ("0x1F", 31),
        ("0o17", 15),
        ("017", 15),
        ("09", 9),
        ("-0b101", -5),
        ("1_024", 1024),
        ("y", True),
        ("off", False),
        ("~", None),
        ("'1e3'", "1e3"),
        ("12Gi", "12Gi"),
        (".inf", ".inf"),
    ],
)
def test_scalars_as_kubectl_sends_them(text, value):
    [document] = load_all(f"v: {text}\n")
    assert document["v"] == value and type(document["v"]) is type(value)


def test_keys_are_strings_as_in_json():
    [document] = load_all("y: 1\n2: x\n~: z\n")
    assert document == {"true": 1, "2": "x", "null": "z"}


def test_merge_keys_still_work():
    [document] = load_all("base: &b {a: 1}\nuse: {<<: *b, c: 2}\n")
    assert document["use"] == {"a": 1, "c": 2}


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        (2, []),
        (None, []),
        (-1, [".spec.replicas: Invalid value: -1: should be a non-negative integer"]),
        (2**31, [".spec.replicas: Invalid value: 2147483648: should be less than or equal to 2147483647"]),
        (
            "two",
            [
                ".spec.replicas: Invalid value: 0: .spec.replicas accessor error: two is of the type string, expected int64"
            ],
        ),
        (
            1.5,
            [
                ".spec.replicas: Invalid value: 0: .spec.replicas accessor error: 1.5 is of the type float64, expected int64"
            ],
        ),
    ],
)
def test_the_scale_subresource_checks_the_replica_count_as_apiextensions_does(replicas, expected):
    from kvtier.api.schema import scale_errors

    body = {"spec": {} if replicas is None else {"replicas": replicas}}
    assert [str(error) for error in scale_errors(".spec.replicas", body)] == expected
    assert scale_errors(None, body) == []
