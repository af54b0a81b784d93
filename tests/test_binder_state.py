"""The Binder's pod book: the informer's copy of each pod, or the Binder's own later write until
the informer shows it, each pod held once (services.binder.state.PodBook)."""

from __future__ import annotations

from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb
from services.binder.state import ClusterState
from store.encoded import EncodedObjects


def _pod(name: str, rv: int, node: str = "", job: str = "j") -> pb.Pod:
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name, resource_version=rv))
    pod.spec.job = job
    pod.spec.node_name = node
    pod.status.phase = pb.POD_BOUND if node else pb.POD_PENDING
    pod.spec.template.requests.milli_cpu = 100
    return pod


class _Informer:
    """The informer's side as the Binder sees it: its cache is updated first, then the
    handlers run (store.informer)."""

    def __init__(self) -> None:
        self.cache: EncodedObjects[pb.Pod] = EncodedObjects(pb.Pod)
        self.state = ClusterState(lambda kind: self.cache)

    def put(self, pod: pb.Pod) -> None:
        old = self.cache.get(pod.metadata.name)
        self.cache[pod.metadata.name] = pod
        if old is None:
            self.state.on_add("Pod", pod)
        else:
            self.state.on_update("Pod", old, pod)

    def delete(self, name: str) -> None:
        pod = self.cache.pop(name)
        self.state.on_delete("Pod", pod)


def _node_of(state: ClusterState, name: str) -> str | None:
    return state.pod_node.get(name)


def test_the_binders_write_stands_until_the_informer_shows_it() -> None:
    informer = _Informer()
    state = informer.state
    informer.put(_pod("p", 1))
    state.record_written(_pod("p", 5, node="n1"), informer.cache["p"])
    assert state.pods["p"].spec.node_name == "n1" and _node_of(state, "p") == "n1"
    informer.put(_pod("p", 3))  # older than the write: the write stands
    assert state.pods["p"].metadata.resource_version == 5 and _node_of(state, "p") == "n1"
    informer.put(_pod("p", 5, node="n1"))  # the write itself: the book reads the informer again
    assert not state.pods.written and state.pods["p"] == informer.cache["p"]
    informer.put(_pod("p", 9))  # a later change by someone else (unbound)
    assert state.pods["p"].metadata.resource_version == 9 and _node_of(state, "p") is None


def test_a_pod_only_written_is_listed_and_forgotten_when_deleted() -> None:
    informer = _Informer()
    state = informer.state
    informer.put(_pod("a", 1))
    state.record_written(_pod("b", 2, node="n1"), None)  # a replacement created
    assert sorted(state.pods) == ["a", "b"] and len(state.pods) == 2
    assert [p.metadata.name for p in state.pods_of_job("j")] in (["a", "b"], ["b", "a"])
    informer.put(_pod("b", 2, node="n1"))
    informer.delete("b")
    assert "b" not in state.pods and sorted(state.pods) == ["a"]
    assert _node_of(state, "b") is None and list(state.all_job_pods) == ["j"]
    assert set(state.all_job_pods.get("j")) == {"a"}


def test_a_write_the_informer_already_delivered_is_not_assumed() -> None:
    informer = _Informer()
    state = informer.state
    informer.put(_pod("p", 7, node="n2"))
    state.record_written(_pod("p", 7, node="n2"), informer.cache["p"])
    assert not state.pods.written and _node_of(state, "p") == "n2"


def test_a_state_fed_by_hand_keeps_its_own_copies() -> None:
    state = ClusterState()
    state.on_add("Pod", _pod("p", 1, node="n1"))
    old: Message = _pod("p", 1, node="n1")
    state.on_update("Pod", old, _pod("p", 2, node="n2"))
    assert state.pods["p"].spec.node_name == "n2" and _node_of(state, "p") == "n2"
    state.on_delete("Pod", _pod("p", 2, node="n2"))
    assert "p" not in state.pods and len(state.pods) == 0 and _node_of(state, "p") is None


def test_a_placed_pods_indexes_share_one_name_and_its_nodes_string() -> None:
    """Every index of a placed pod keeps the same name string, and the node's own string:
    a copy of each per index was ~170 bytes a pod at a million pods."""
    informer = _Informer()
    state = informer.state
    informer.put(_pod("n1-node", 1))  # a pending pod named like nothing else
    for i in range(3):
        informer.put(_pod(f"p{i}", 2 + i, node="n1"))
    info = state.infos["n1"]
    for name, node in state.pod_node.items():
        [key] = [k for k in state.pod_queue if k == name]
        assert key is name and info.pods[name].name is name
        assert node is info.name
