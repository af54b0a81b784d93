"""The Binder's records of pods: its own write stands until the informer shows it, and a pod
holding a claim is records only, its bytes kept nowhere (services.binder.state)."""

from __future__ import annotations

from google.protobuf.message import Message

from placement.rules import hard_rules
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services.binder.decide import BatchPlan
from services.binder.state import ClusterState, keeps, watched
from store import Store
from store.client import Bind
from store.encoded import EncodedObjects
from store.informer import Informer
from tests import factories as f


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


async def test_after_a_relist_the_records_are_what_a_fresh_listing_builds(
    store_url: str, cluster_name: str
) -> None:
    """A Binder's informer that fell behind a trimmed feed relists: a bound pod deleted
    meanwhile is delivered as its records outline it (its job found from them), one finished
    or bound meanwhile as a change; the records end as a fresh Binder's listing builds them,
    and no bound pod's bytes are kept."""
    small = await Store.connect(store_url, cluster=cluster_name, feed_max_len=10)
    informer, state = watched(small)
    fresh_informer: Informer | None = None
    try:
        await small.create(f.node("n1"))
        web = f.job("web", replicas=3, cpu=100)
        web.spec.template.labels["app"] = "web"
        await small.create_unit(web, f.pods_of(web))
        solo = f.job("solo", cpu=100)
        await small.create_unit(solo, f.pods_of(solo))
        for name in ("web-0", "web-1", "web-2"):
            await _bind(small, name, "n1")
        informer.start()
        await informer.wait_synced(10)
        assert set(state.pod_node) == {"web-0", "web-1", "web-2"}
        await informer.stop()  # falls behind while the feed moves on and is trimmed
        await small.delete(pb.Pod, "web-0")
        finished = await small.get(pb.Pod, "web-1")
        finished.status.phase = pb.POD_SUCCEEDED
        await small.update(finished)
        await _bind(small, "solo-0", "n1")
        for i in range(700):  # the feed is trimmed by whole blocks: well past its 10
            await small.create(f.node(f"m{i}"))
        informer.start()
        await informer.wait_for_revision(await small.revision(), timeout=10)
        assert informer.relists == 1

        fresh_informer, fresh = watched(small)
        fresh_informer.start()
        await fresh_informer.wait_synced(10)
        for s in (state, fresh):
            assert set(s.pod_node) == {"web-2", "solo-0"}
            assert set(s.names_of_job("web")) == {"web-1", "web-2"}
            assert set(s.job_pods.get("web")) == {"web-2"} and s.bound_count("solo") == 1
            assert {n: (o.queue, o.job, dict(o.labels)) for n, o in s.pod_origin.items()} == {
                "web-2": ("default", "web", {"app": "web"}),
                "solo-0": ("default", "solo", {}),
            }
            assert s.queue_usage["default"].cpu == 200
        assert sorted(informer.names("Pod")) == sorted(fresh_informer.names("Pod")) == ["web-1"]
    finally:
        await informer.stop()
        if fresh_informer is not None:
            await fresh_informer.stop()
        await small.close()


async def test_a_binder_started_over_a_listing_judges_as_one_fed_pod_by_pod(
    store: Store,
) -> None:
    """A Binder (re)starting takes each bound pod of its listing straight into its records
    (``take_listed``), the pods of one template sharing that template's part, read once; yet
    its records equal those of a state fed the same pods one by one, and it judges a batch —
    a bind, a preemption, a placement over its queue's max — exactly as that state does."""
    await store.create(f.node("n1", cpu=1000))
    await store.create(f.node("n2", cpu=4000))
    quota = pb.Queue(metadata=pb.ObjectMeta(name="q"))
    quota.spec.quota.milli_cpu = 1000
    await store.create(quota)
    web = f.job("web", replicas=3, cpu=300)
    web.spec.template.labels["app"] = "web"
    batch = ipb.DecisionBatch(shard="s", batch_id=1)
    for job, priority, queue, node, chosen in (
        (web, 1, "q", "", []),
        (f.job("high", cpu=400), 10, "default", "n1", ["web-0"]),  # preempts to fit
        (f.job("fits", cpu=50), 1, "default", "n2", []),
        (f.job("over", cpu=500), 1, "q", "n2", []),  # past q's max even with web-0 gone
    ):
        job.spec.priority, job.spec.preemptible, job.spec.queue = priority, True, queue
        pods = f.pods_of(job)
        for pod in pods:
            pod.spec.priority, pod.spec.preemptible, pod.spec.queue = priority, True, queue
        await store.create_unit(job, pods)
        if node:
            unit = batch.units.add(job=job.metadata.name, min_member=1)
            created = await store.get(pb.Pod, pods[0].metadata.name)
            unit.placements.add(
                pod=created.metadata.name,
                node=node,
                pod_resource_version=created.metadata.resource_version,
                victims=chosen,
            )
    for name in ("web-0", "web-1", "web-2"):
        await _bind(store, name, "n1")

    informer, listed = watched(store)
    informer.start()
    try:
        await informer.wait_synced(10)
    finally:
        await informer.stop()
    fed = ClusterState()
    for kind in (pb.Node, pb.Queue, pb.Job, pb.Pod):
        objects, _ = await store.list_all(kind)
        for obj in objects:
            fed.on_add(kind.__name__, obj)

    assert len(listed.template_parts) == 1  # the web pods' one template, read once
    on_n1 = listed.infos["n1"].pods
    assert on_n1["web-0"].requests is on_n1["web-2"].requests
    assert not informer.names("Pod") or set(informer.names("Pod")).isdisjoint(on_n1)
    for name in ("n1", "n2"):
        assert listed.infos[name].pods == fed.infos[name].pods
        assert listed.infos[name].requested == fed.infos[name].requested
    assert listed.pod_node == fed.pod_node and listed.pod_origin == fed.pod_origin
    assert listed.queue_usage == fed.queue_usage
    assert set(listed.job_pods.get("web")) == set(fed.job_pods.get("web"))
    assert listed.seen_revision <= informer.revision

    names = [p.pod for u in batch.units for p in u.placements]
    decided: dict[str, pb.Pod | None] = {n: await store.get(pb.Pod, n) for n in names}
    jobs: dict[str, pb.Job | None] = {u.job: await store.get(pb.Job, u.job) for u in batch.units}
    victims: dict[str, pb.Pod | None] = {"web-0": await store.get(pb.Pod, "web-0")}
    judged = []
    for state in (listed, fed):
        plan = BatchPlan(batch, dict(decided), dict(jobs), state, hard_rules(), victims)
        plan.run()
        judged.append(
            (
                {
                    n: [v.metadata.name for v in plan.claims.evict.get(n, [])]
                    for n in plan.candidates
                },
                {n: (r.code, r.reason) for n, r in plan.rejected.items()},
            )
        )
    assert judged[0] == judged[1]
    accepted, rejected = judged[0]
    assert accepted == {"high-0": ["web-0"], "fits-0": []}
    assert list(rejected) == ["over-0"] and "q" in rejected["over-0"][1]


async def _bind(store: Store, name: str, node: str) -> None:
    pod = await store.get(pb.Pod, name)
    pod.spec.node_name, pod.status.phase = node, pb.POD_BOUND
    await store.commit([Bind(pod)])
