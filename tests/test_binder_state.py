"""The Binder's records of pods: its own write stands until the informer shows it, and a pod
holding a claim is records only, its bytes kept nowhere (services.binder.state)."""

from __future__ import annotations

from google.protobuf.message import Message

from protos.godel.v1 import objects_pb2 as pb
from services.binder.state import ClusterState, keeps
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
        name = pod.metadata.name
        old = self.cache.get(name)
        if old is None and name in self.state.held_elsewhere("Pod"):
            old = self.state.recall("Pod", name)
        if keeps("Pod", pod):
            self.cache[name] = pod
        else:
            self.cache.pop(name, None)
        if old is None:
            self.state.on_add("Pod", pod)
        else:
            self.state.on_update("Pod", old, pod)

    def delete(self, pod: pb.Pod) -> None:
        self.cache.pop(pod.metadata.name, None)
        self.state.on_delete("Pod", pod)


def _node_of(state: ClusterState, name: str) -> str | None:
    return state.pod_node.get(name)


def test_the_binders_write_stands_until_the_informer_shows_it() -> None:
    informer = _Informer()
    state = informer.state
    informer.put(_pod("p", 1))
    state.record_written(_pod("p", 5, node="n1"), 1)
    assert state.written == {"p": 5} and _node_of(state, "p") == "n1"
    informer.put(_pod("p", 3))  # older than the write: the write stands
    assert _node_of(state, "p") == "n1"
    informer.put(_pod("p", 5, node="n1"))  # the write itself: no longer the binder's own
    assert not state.written and _node_of(state, "p") == "n1"
    assert "p" not in informer.cache  # bound: records only
    informer.put(_pod("p", 9))  # a later change by someone else (unbound)
    assert _node_of(state, "p") is None and "p" in informer.cache


def test_a_pod_only_written_is_known_and_forgotten_when_deleted() -> None:
    informer = _Informer()
    state = informer.state
    informer.put(_pod("a", 1))
    state.record_written(_pod("b", 2, node="n1"), 1)  # a replacement created
    assert set(state.names_of_job("j")) == {"a", "b"} and _node_of(state, "b") == "n1"
    informer.put(_pod("b", 2, node="n1"))
    informer.delete(_pod("b", 2, node="n1"))
    assert _node_of(state, "b") is None and list(state.unplaced_job_pods) == ["j"]
    assert set(state.names_of_job("j")) == {"a"} and not state.written and not state.job_pods


def test_a_write_the_informer_already_delivered_is_not_assumed() -> None:
    informer = _Informer()
    state = informer.state
    informer.put(_pod("p", 7, node="n2"))
    state.record_written(_pod("p", 7, node="n2"), 0)  # the informer's revision lags: no matter
    assert not state.written and _node_of(state, "p") == "n2"
    state.record_written(_pod("q", 6, node="n2"), 0)  # delivered before p's change: so was q's
    assert not state.written and _node_of(state, "q") is None


def test_a_state_fed_by_hand_keeps_only_what_an_informer_would() -> None:
    state = ClusterState()
    state.on_add("Pod", _pod("p", 1, node="n1"))
    assert "p" not in state.unplaced_pods() and _node_of(state, "p") == "n1"
    old: Message = _pod("p", 1, node="n1")
    state.on_update("Pod", old, _pod("p", 2))
    assert state.unplaced_pods()["p"].metadata.resource_version == 2
    assert _node_of(state, "p") is None
    state.on_delete("Pod", _pod("p", 2))
    assert "p" not in state.unplaced_pods() and not list(state.names_of_job("j"))


def test_a_placed_pods_records_outline_it_for_the_informer() -> None:
    """What the informer hands over as a bound pod's state before (its bytes are not kept):
    its name, job, node and template labels, from the records."""
    informer = _Informer()
    state = informer.state
    pod = _pod("p", 1, node="n1")
    pod.spec.template.labels["app"] = "web"
    informer.put(pod)
    assert list(state.held_elsewhere("Pod")) == ["p"] and not state.held_elsewhere("Job")
    outline = state.recall("Pod", "p")
    assert isinstance(outline, pb.Pod)
    assert (outline.spec.job, outline.spec.node_name, dict(outline.spec.template.labels)) == (
        "j",
        "n1",
        {"app": "web"},
    )


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
        [key] = [k for k in state.pod_origin if k == name]
        assert key is name and info.pods[name].name is name
        assert node is info.name


def test_a_jobs_placed_pods_share_one_record_of_their_job() -> None:
    """Queue, job and template labels are one record a job (its pods carry its template's),
    gone once the job has no pod placed."""
    informer = _Informer()
    state = informer.state
    for i in range(3):
        pod = _pod(f"p{i}", 1 + i, node="n1")
        pod.spec.template.labels["app"] = "web"
        informer.put(pod)
    origins = {id(state.pod_origin[f"p{i}"]) for i in range(3)}
    assert len(origins) == 1 and dict(state.pod_origin["p0"].labels) == {"app": "web"}
    assert state.held_by("p0") is not None and state.held_by("p0")[0] == "default"
    for i in range(3):
        informer.put(_pod(f"p{i}", 10 + i))  # unbound
    assert not state.pod_origin and not state._origins
