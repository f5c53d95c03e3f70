"""CEL rules ratchet as kube-apiserver's do (CRDValidationRatcheting, GA since 1.33): an update is not refused for
a value it leaves unchanged; a changed value and transition rules (`oldSelf`) are still checked."""

from kvtier.api.cel import validate_rules

SCHEMA = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [{"rule": "self.low <= self.high", "message": "low above high"}],
            "properties": {"low": {"type": "integer"}, "high": {"type": "integer"}},
        },
        "status": {"type": "object", "properties": {"seen": {"type": "integer"}}},
    },
}
IMMUTABLE = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "x-kubernetes-validations": [{"rule": "self == oldSelf", "message": "immutable"}],
            "properties": {"low": {"type": "integer"}},
        }
    },
}
BAD = {"spec": {"low": 5, "high": 1}}


def test_a_create_checks_every_rule():
    assert [f.message for f in validate_rules(SCHEMA, BAD)] == ["low above high"]


def test_an_update_leaving_an_invalid_value_unchanged_is_not_refused_for_it():
    assert validate_rules(SCHEMA, {**BAD, "status": {"seen": 2}}, {**BAD, "status": {"seen": 1}}) == []


def test_an_update_changing_the_value_is_checked():
    changed = {"spec": {"low": 6, "high": 1}}
    assert [f.message for f in validate_rules(SCHEMA, changed, BAD)] == ["low above high"]


def test_transition_rules_run_whatever_changed():
    # A rule reading oldSelf is evaluated on an unchanged value too (it passes here: self == oldSelf).
    assert validate_rules(IMMUTABLE, {"spec": {"low": 1}}, {"spec": {"low": 1}}) == []
    assert [f.message for f in validate_rules(IMMUTABLE, {"spec": {"low": 2}}, {"spec": {"low": 1}})] == ["immutable"]
