"""Objects held encoded (store.encoded) and label sets shared between pods (placement.nodeinfo):
what keeps a process holding a million pods small."""

from __future__ import annotations

import pytest

from placement.nodeinfo import PodRequest, shared_labels
from protos.godel.v1 import objects_pb2 as pb
from store.encoded import EncodedList, EncodedObjects


def _pod(name: str, node: str = "", labels: dict[str, str] | None = None) -> pb.Pod:
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name, uid=f"uid-{name}", resource_version=7))
    pod.metadata.labels.update(labels or {})
    pod.spec.node_name = node
    pod.spec.template.requests.milli_cpu = 250
    return pod


def test_encoded_objects_read_back_equal_copies() -> None:
    pods: EncodedObjects[pb.Pod] = EncodedObjects(pb.Pod)
    pods["a"] = _pod("a", "n1")
    read = pods["a"]
    assert read == _pod("a", "n1")
    read.spec.node_name = "elsewhere"  # a copy: what is stored does not change
    assert pods["a"].spec.node_name == "n1"
    assert pods["a"] is not pods["a"]
    assert pods.get_encoded("a") == _pod("a", "n1").SerializeToString()


@pytest.mark.parametrize(
    ("operation", "expected_names"),
    [
        (lambda m: None, ["a", "b"]),
        (lambda m: m.__delitem__("a"), ["b"]),
        (lambda m: m.pop("b"), ["a"]),
        (lambda m: m.__setitem__("c", _pod("c")), ["a", "b", "c"]),
        (lambda m: m.put_encoded("d", _pod("d").SerializeToString()), ["a", "b", "d"]),
    ],
    ids=["none", "del", "pop", "set", "put_encoded"],
)
def test_encoded_objects_behave_as_a_mapping(operation: object, expected_names: list[str]) -> None:
    pods: EncodedObjects[pb.Pod] = EncodedObjects(pb.Pod)
    pods["a"], pods["b"] = _pod("a"), _pod("b")
    operation(pods)  # type: ignore[operator]
    assert sorted(pods) == expected_names and len(pods) == len(expected_names)
    assert [p.metadata.name for p in pods.values()] == list(pods)
    assert ("a" in pods) == ("a" in expected_names) and "zz" not in pods
    assert pods.get("zz") is None
    with pytest.raises(KeyError):
        pods["zz"]


def test_encoded_list_is_sorted_by_name_and_pages_by_name() -> None:
    listed = EncodedList(pb.Pod, [_pod(n) for n in ("c", "a", "e", "b", "d")])
    assert len(listed) == 5
    assert [p.metadata.name for p in listed[:]] == ["a", "b", "c", "d", "e"]
    assert listed[1] == _pod("b")
    assert listed.position_after("b") == 2 and listed.position_after("bb") == 2
    assert listed.position_after("") == 0 and listed.position_after("z") == 5
    assert [p.metadata.name for p in listed[2:4]] == ["c", "d"]
    assert len(EncodedList(pb.Pod, [])) == 0


def test_pods_with_the_same_labels_share_one_label_set() -> None:
    one = PodRequest.from_pod(_pod("a", labels={"app": "web", "tier": "1"}))
    two = PodRequest.from_pod(_pod("b", labels={"tier": "1", "app": "web"}))
    other = PodRequest.from_pod(_pod("c", labels={"app": "db"}))
    assert one.labels is two.labels and one.labels == {"app": "web", "tier": "1"}
    assert other.labels == {"app": "db"} and other.labels is not one.labels
    assert PodRequest.from_pod(_pod("d")).labels == {}
    assert shared_labels({"x": "1"}) is shared_labels({"x": "1"})


def test_a_copy_is_independent_of_later_changes() -> None:
    pods: EncodedObjects[pb.Pod] = EncodedObjects(pb.Pod)
    pods["a"] = _pod("a", "n1")
    copied = pods.copy()
    pods["a"] = _pod("a", "n2")
    pods["b"] = _pod("b")
    del pods["a"]
    assert list(copied) == ["a"] and copied["a"].spec.node_name == "n1"
