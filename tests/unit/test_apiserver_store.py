"""The embedded API server's store: its namespace index and cached order agree with a scan and a sort."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.testing.apiserver.store import Store

KEY = ("", "configmaps")


def _obj(namespace: str, name: str, value: int = 0) -> dict:
    return {"metadata": {"namespace": namespace, "name": name}, "data": {"v": str(value)}}


def _scan(store: Store, namespace: str | None) -> list[tuple[str, str]]:
    """What the store used to answer: every object, filtered by namespace and sorted."""
    objects = store.collection(KEY).objects.values()
    found = [s.obj["metadata"] for s in objects if not namespace or s.obj["metadata"]["namespace"] == namespace]
    return sorted((m["namespace"], m["name"]) for m in found)


def _ordered(store: Store, namespace: str | None) -> list[tuple[str, str]]:
    return [
        (s.obj["metadata"]["namespace"], s.obj["metadata"]["name"]) for s in store.collection(KEY).ordered(namespace)
    ]


operations = st.lists(
    st.tuples(st.sampled_from(["put", "put", "remove"]), st.sampled_from(["a", "b", "kube-system"]), st.integers(0, 9)),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(operations)
def test_the_index_answers_what_a_scan_and_a_sort_would(ops):
    store = Store()
    for step, (op, namespace, number) in enumerate(ops):
        if op == "put":
            store.put(KEY, _obj(namespace, f"obj-{number}", step))
        else:
            store.remove(KEY, (namespace, f"obj-{number}"))
        for ns in (None, "", "a", "b", "kube-system", "absent"):
            assert _ordered(store, ns) == _scan(store, ns)
            assert sorted(s.obj["metadata"]["name"] for s in store.collection(KEY).in_namespace(ns)) == sorted(
                name for _, name in _scan(store, ns)
            )


def test_a_modified_object_is_listed_in_its_new_state_without_reordering():
    store = Store()
    names = [f"n{i}" for i in range(20)]
    random.Random(4).shuffle(names)
    for name in names:
        store.put(KEY, _obj("a", name))
    assert _ordered(store, "a") == sorted(("a", n) for n in names)
    store.put(KEY, _obj("a", "n7", 42))
    listed = store.collection(KEY).ordered("a")
    assert [s.obj["metadata"]["name"] for s in listed] == sorted(names)
    assert next(s for s in listed if s.obj["metadata"]["name"] == "n7").obj["data"] == {"v": "42"}
    store.remove(KEY, ("a", "n7"))
    assert ("a", "n7") not in _ordered(store, "a")
    assert store.collection(KEY).namespaces.get("b") is None
