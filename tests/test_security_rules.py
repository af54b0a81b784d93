"""The rules of authentication and authorisation, table by table: certificates and the
identities they name, which role may call which method, what a tenant may do with which object,
and which user process-mode pods run as. tests/e2e/test_tls.py proves them on a live cluster."""

from __future__ import annotations

import pwd
from dataclasses import replace
from pathlib import Path

import pytest
from cryptography import x509

from foundation import pki, tls
from foundation.tls import Identity
from protos.godel.v1 import internal_pb2 as ipb
from protos.godel.v1 import objects_pb2 as pb
from services import events, tenancy
from services.binder import evictrules
from services.nodeagent.runner import RunAs, resolve_run_as
from services.runtime import ServiceHost, StartupError
from services.runtime.auth import refusal
from store import Store

ADMIN = Identity("admin", "admin")
SERVICE = Identity(tls.SERVICE_NAME, "service")  # the probes' identity: a service of no kind
DISPATCHER, SCHEDULER, BINDER, RESCHEDULER, NODEAGENT, DASHBOARD = (
    Identity(kind, "service") for kind in tls.SERVICE_KINDS
)
ALICE = Identity("alice", "tenant", ("research", "default"))
BOB = Identity("bob", "tenant", ("batch",))


def test_a_cluster_ca_issues_identities_with_their_role_and_queues(tmp_path: Path) -> None:
    pki.init_cluster(tmp_path, ["dispatcher", "10.0.0.7"])
    pki.issue(tmp_path, "alice", "tenant", queues=["research", "default"])
    stems = ("ca", "service", *tls.SHARED_KINDS, "admin", "alice")
    assert {p.name for p in tmp_path.iterdir()} == {
        f"{stem}.{ext}" for stem in stems for ext in ("crt", "key")
    }
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.iterdir()), "private to owner"
    cases = [("service", SERVICE), ("admin", ADMIN), ("alice", ALICE)]
    cases += [(kind, Identity(kind, "service")) for kind in tls.SHARED_KINDS]
    for stem, identity in cases:
        assert pki.identity_of(tls.load(tmp_path, stem).certificate) == identity, stem
    service = x509.load_pem_x509_certificate((tmp_path / "service.crt").read_bytes())
    names = service.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = names.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    assert {tls.SERVICE_NAME, "localhost", "dispatcher"} <= set(dns)
    assert {"127.0.0.1", "10.0.0.7"} <= set(ips)
    for kind in tls.SHARED_KINDS:  # each kind's certificate names every address too
        kind_names = (
            x509.load_pem_x509_certificate((tmp_path / f"{kind}.crt").read_bytes())
            .extensions.get_extension_for_class(x509.SubjectAlternativeName)
            .value
        )
        assert {tls.SERVICE_NAME, "dispatcher"} <= set(kind_names.get_values_for_type(x509.DNSName))
    # A second init keeps the CA: certificates issued before stay valid.
    before = (tmp_path / "ca.crt").read_bytes()
    assert pki.init_cluster(tmp_path) == []
    assert (tmp_path / "ca.crt").read_bytes() == before


def test_init_brings_a_directory_from_before_per_kind_identities_up_to_date(
    tmp_path: Path,
) -> None:
    pki.init_cluster(tmp_path)
    kept = {stem: (tmp_path / f"{stem}.crt").read_bytes() for stem in ("ca", "service", "admin")}
    for kind in tls.SHARED_KINDS:  # the layout of an older release: one service identity
        (tmp_path / f"{kind}.crt").unlink()
        (tmp_path / f"{kind}.key").unlink()
    assert pki.init_cluster(tmp_path, ["binder"]) == list(tls.SHARED_KINDS)
    assert {stem: (tmp_path / f"{stem}.crt").read_bytes() for stem in kept} == kept
    assert pki.identity_of(tls.load(tmp_path, "binder").certificate) == BINDER


def test_each_node_agent_has_its_own_certificate_naming_the_nodes_it_serves(
    tmp_path: Path,
) -> None:
    agents = {"nodeagent-0": ["nodeagent-0-*", "myhost"], "nodeagent-1": ["nodeagent-1-*"]}
    issued = pki.init_cluster(tmp_path, agents=agents)
    assert issued[-2:] == ["nodeagent.nodeagent-0", "nodeagent.nodeagent-1"]
    assert not (tmp_path / "nodeagent.crt").exists(), "no certificate shared by every agent"
    zero = pki.identity_of(tls.load(tmp_path, tls.agent_stem("nodeagent-0")).certificate)
    assert zero == Identity(
        "nodeagent", "service", agent="nodeagent-0", nodes=("nodeagent-0-*", "myhost")
    )
    assert refusal("/godel.v1.Binder/Evict", zero) is None  # the kind's method rules hold
    assert pki.names_address(tls.load(tmp_path, "nodeagent.nodeagent-0").certificate, "localhost:1")
    # Kept while it names the nodes asked for; issued again when they change (another host).
    kept = (tmp_path / "nodeagent.nodeagent-1.crt").read_bytes()
    assert pki.init_cluster(tmp_path, agents=agents) == []
    moved = {**agents, "nodeagent-0": ["nodeagent-0-*", "otherhost"]}
    assert pki.init_cluster(tmp_path, agents=moved) == ["nodeagent.nodeagent-0"]
    assert pki.identity_of((tmp_path / "nodeagent.nodeagent-0.crt").read_bytes()).nodes == (
        "nodeagent-0-*",
        "otherhost",
    )
    assert (tmp_path / "nodeagent.nodeagent-1.crt").read_bytes() == kept


def test_init_removes_the_certificate_every_agent_shared_before(tmp_path: Path) -> None:
    pki.init_cluster(tmp_path)
    pki.issue(tmp_path, "nodeagent", "service")  # as init made it before agents had their own
    assert pki.identity_of((tmp_path / "nodeagent.crt").read_bytes()) == NODEAGENT
    assert pki.init_cluster(tmp_path, agents={"nodeagent-0": ["nodeagent-0-*"]}) == [
        "nodeagent.nodeagent-0"
    ]
    assert not (tmp_path / "nodeagent.crt").exists() and not (tmp_path / "nodeagent.key").exists()


@pytest.mark.parametrize(
    ("nodes", "node", "served"),
    [
        (("nodeagent-0-*",), "nodeagent-0-0", True),
        (("nodeagent-0-*",), "nodeagent-0-17", True),
        (("nodeagent-1-*",), "nodeagent-10-0", False),  # another agent's, sharing a prefix
        (("nodeagent-0-*", "myhost"), "myhost", True),
        (("myhost",), "myhost2", False),
        (("nodeagent-0-*",), "", False),  # a pod bound nowhere
        ((), "nodeagent-0-0", False),  # the shared certificate of before names no node
    ],
)
def test_which_nodes_an_agent_identity_serves(
    nodes: tuple[str, ...], node: str, served: bool
) -> None:
    identity = Identity("nodeagent", "service", agent="a", nodes=nodes)
    assert identity.serves(node) is served


@pytest.mark.parametrize(
    ("agent", "nodes", "error"),
    [
        ("Agent-0", ["agent-0-*"], "agent 'Agent-0' must be a DNS-1123 label"),
        ("agent-0", [], "name at least one node"),
        ("agent-0", ["*"], r"node '\*' must be a node's name"),  # every node of the cluster
        ("agent-0", ["a-*-b"], r"node 'a-\*-b' must be"),
        ("agent-0", ["Big-*"], r"node 'Big-\*' must be"),
        ("agent-0", ["a b"], "node 'a b' must be"),
        ("agent-0", ["ok\n"], "must be"),
    ],
)
def test_issuing_an_agent_refuses_bad_names_and_nodes(
    tmp_path: Path, agent: str, nodes: list[str], error: str
) -> None:
    pki.init_cluster(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(tls.CredentialsError, match=error):
        pki.issue_agent(tmp_path, agent, nodes)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(
    ("name", "role", "queues", "error"),
    [
        ("Alice", "tenant", [], "DNS-1123"),
        ("alice", "tenant", ["Bad_Queue"], "queue 'Bad_Queue'"),
        ("alice", "owner", [], "role 'owner'"),
    ],
)
def test_issuing_refuses_bad_names_and_roles(
    tmp_path: Path, name: str, role: str, queues: list[str], error: str
) -> None:
    pki.init_cluster(tmp_path)
    with pytest.raises(tls.CredentialsError, match=error):
        pki.issue(tmp_path, name, role, queues=queues)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "identity", "rule"),
    [
        # Internal RPCs admit the service kinds that call them in a job's flow, and no other.
        ("/godel.v1.Binder/Decide", SCHEDULER, None),
        ("/godel.v1.Binder/Decide", DISPATCHER, "rule decide"),
        ("/godel.v1.Binder/Decide", BINDER, "rule decide"),
        ("/godel.v1.Binder/Decide", NODEAGENT, "rule decide"),
        ("/godel.v1.Binder/Decide", DASHBOARD, "rule decide"),
        ("/godel.v1.Binder/Decide", SERVICE, "rule decide"),
        ("/godel.v1.Binder/Decide", ADMIN, "rule decide"),
        ("/godel.v1.Binder/Decide", ALICE, "rule decide"),
        ("/godel.v1.Binder/Evict", DISPATCHER, None),
        ("/godel.v1.Binder/Evict", RESCHEDULER, None),
        ("/godel.v1.Binder/Evict", NODEAGENT, None),
        ("/godel.v1.Binder/Evict", ADMIN, None),
        ("/godel.v1.Binder/Evict", SCHEDULER, "rule evict"),
        ("/godel.v1.Binder/Evict", DASHBOARD, "rule evict"),
        ("/godel.v1.Binder/Evict", SERVICE, "rule evict"),
        ("/godel.v1.Binder/Evict", ALICE, "rule evict"),
        ("/godel.v1.Scheduler/Dispatch", DISPATCHER, None),
        ("/godel.v1.Scheduler/Dispatch", SCHEDULER, "rule dispatch"),
        ("/godel.v1.Scheduler/Dispatch", RESCHEDULER, "rule dispatch"),
        ("/godel.v1.Scheduler/Dispatch", SERVICE, "rule dispatch"),
        ("/godel.v1.Scheduler/Dispatch", ADMIN, "rule dispatch"),
        ("/godel.v1.Binder/Unknown", SCHEDULER, "rule default-deny"),
        ("/godel.v1.Dispatcher/Submit", ADMIN, None),
        ("/godel.v1.Dispatcher/Submit", ALICE, None),
        ("/godel.v1.Dispatcher/List", SERVICE, "rule public-api"),
        ("/godel.v1.Dispatcher/List", DASHBOARD, "rule public-api"),
        ("/godel.v1.NodeAgent/Logs", ALICE, None),
        ("/godel.v1.NodeAgent/Logs", SERVICE, "rule public-api"),
        ("/godel.v1.Rescheduler/ListPolicies", ALICE, None),
        ("/godel.v1.Rescheduler/Trigger", ADMIN, None),
        ("/godel.v1.Rescheduler/Trigger", ALICE, "rule admin-only"),
        ("/godel.v1.Rescheduler/Pause", ALICE, "rule admin-only"),
        ("/grpc.health.v1.Health/Check", ALICE, None),
        ("/grpc.health.v1.Health/Check", SERVICE, None),
        ("/grpc.health.v1.Health/Check", BINDER, None),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", ALICE, None),
        ("/godel.v1.Unknown/Call", ADMIN, "rule default-deny"),
    ],
)
def test_method_rules(method: str, identity: Identity, rule: str | None) -> None:
    why = refusal(method, identity)
    if rule is None:
        assert why is None
    else:
        assert why is not None and why.startswith(rule), why
        assert repr(identity.name) in why or "no rule" in why


def _job(name: str, queue: str = "", owner: str = "") -> pb.Job:
    job = pb.Job(metadata=pb.ObjectMeta(name=name, owner=owner))
    job.spec.queue = queue
    return job


ALICES_JOB = _job("a", "research", owner="alice")
ALICES_POD = pb.Pod(metadata=pb.ObjectMeta(name="a-0", owner="alice"))
ADMINS_JOB = _job("x")
NODE = pb.Node(metadata=pb.ObjectMeta(name="n1"))
CLASS = pb.PriorityClass(metadata=pb.ObjectMeta(name="high"), value=1000)
ALICES_EVENT = events.make_event(
    events.ref("Pod", ALICES_POD), "Preempted", "m", source="binder-0", owner="alice"
)
NODES_EVENT = events.make_event(events.ref("Node", NODE), "ShardLost", "m", source="dispatcher")


@pytest.mark.parametrize(
    ("what", "refusal_of", "rule"),
    [
        ("tenant submits to its queue", lambda: tenancy.submit_refusal(ALICE, _job("j", "research")), None),
        ("tenant submits to the default queue it holds", lambda: tenancy.submit_refusal(ALICE, _job("j")), None),
        ("tenant submits to another queue", lambda: tenancy.submit_refusal(BOB, _job("j", "research")), "rule tenant-queues"),
        ("tenant without the default queue", lambda: tenancy.submit_refusal(BOB, _job("j")), "rule tenant-queues"),
        ("admin submits anywhere", lambda: tenancy.submit_refusal(ADMIN, _job("j", "research")), None),
        ("insecure cluster: no identity", lambda: tenancy.submit_refusal(None, _job("j", "x")), None),
        ("owner reads its job", lambda: tenancy.read_refusal(ALICE, "Job", ALICES_JOB), None),
        ("owner reads its pod", lambda: tenancy.read_refusal(ALICE, "Pod", ALICES_POD), None),
        ("other tenant reads the job", lambda: tenancy.read_refusal(BOB, "Job", ALICES_JOB), "rule own-jobs-only"),
        ("other tenant reads the pod", lambda: tenancy.read_refusal(BOB, "Pod", ALICES_POD), "rule own-jobs-only"),
        ("tenant reads the admin's job", lambda: tenancy.read_refusal(ALICE, "Job", ADMINS_JOB), "rule own-jobs-only"),
        ("tenant reads a node", lambda: tenancy.read_refusal(BOB, "Node", NODE), None),
        ("admin reads a tenant's job", lambda: tenancy.read_refusal(ADMIN, "Job", ALICES_JOB), None),
        ("owner deletes its job", lambda: tenancy.delete_refusal(ALICE, "Job", ALICES_JOB), None),
        ("other tenant deletes the job", lambda: tenancy.delete_refusal(BOB, "Job", ALICES_JOB), "rule own-jobs-only"),
        ("tenant deletes a node", lambda: tenancy.delete_refusal(ALICE, "Node", NODE), "rule admin-only"),
        ("tenant deletes a missing job", lambda: tenancy.delete_refusal(ALICE, "Job", None), None),
        ("admin deletes a node", lambda: tenancy.delete_refusal(ADMIN, "Node", NODE), None),
        ("tenant applies a job into its queue", lambda: tenancy.apply_refusal(ALICE, "Job", _job("j", "research")), None),
        ("tenant applies a job into another queue", lambda: tenancy.apply_refusal(BOB, "Job", _job("j", "research")), "rule tenant-queues"),
        ("tenant applies a queue", lambda: tenancy.apply_refusal(ALICE, "Queue", pb.Queue()), "rule admin-only"),
        ("tenant applies a node", lambda: tenancy.apply_refusal(ALICE, "Node", NODE), "rule admin-only"),
        ("owner applies over its job", lambda: tenancy.apply_over_refusal(ALICE, "Job", ALICES_JOB), None),
        ("other tenant applies over the job", lambda: tenancy.apply_over_refusal(BOB, "Job", ALICES_JOB), "rule own-jobs-only"),
        ("tenant applies over the admin's job", lambda: tenancy.apply_over_refusal(ALICE, "Job", ADMINS_JOB), "rule own-jobs-only"),
        ("admin applies over a tenant's job", lambda: tenancy.apply_over_refusal(ADMIN, "Job", ALICES_JOB), None),
        ("owner reads the event about its pod", lambda: tenancy.read_refusal(ALICE, "Event", ALICES_EVENT), None),
        ("other tenant reads the event about it", lambda: tenancy.read_refusal(BOB, "Event", ALICES_EVENT), "rule own-jobs-only"),
        ("tenant reads the cluster's own event", lambda: tenancy.read_refusal(ALICE, "Event", NODES_EVENT), "rule own-jobs-only"),
        ("admin reads any event", lambda: tenancy.read_refusal(ADMIN, "Event", ALICES_EVENT), None),
        ("owner deletes the event about its pod", lambda: tenancy.delete_refusal(ALICE, "Event", ALICES_EVENT), "rule admin-only"),
        ("tenant drains a node", lambda: tenancy.drain_refusal(ALICE), "rule admin-only"),
        ("admin drains a node", lambda: tenancy.drain_refusal(ADMIN), None),
        ("anyone drains on an insecure cluster", lambda: tenancy.drain_refusal(None), None),
        ("admin applies a node", lambda: tenancy.apply_refusal(ADMIN, "Node", NODE), None),
        ("anyone applies on an insecure cluster", lambda: tenancy.apply_refusal(None, "Queue", pb.Queue()), None),
        ("tenant applies a priority class", lambda: tenancy.apply_refusal(ALICE, "PriorityClass", CLASS), "rule admin-only"),
        ("tenant deletes a priority class", lambda: tenancy.delete_refusal(ALICE, "PriorityClass", CLASS), "rule admin-only"),
        ("tenant reads a priority class", lambda: tenancy.read_refusal(BOB, "PriorityClass", CLASS), None),
        ("admin applies a priority class", lambda: tenancy.apply_refusal(ADMIN, "PriorityClass", CLASS), None),
        ("admin deletes a priority class", lambda: tenancy.delete_refusal(ADMIN, "PriorityClass", CLASS), None),
    ],
)  # fmt: skip
def test_tenancy_rules(what: str, refusal_of: object, rule: str | None) -> None:
    why = refusal_of()  # type: ignore[operator]
    if rule is None:
        assert why is None, what
    else:
        assert why is not None and why.startswith(rule), f"{what}: {why}"


AGENT_0 = Identity("nodeagent", "service", agent="nodeagent-0", nodes=("nodeagent-0-*", "myhost"))


def _pod(name: str, node: str, qos: pb.QoS.ValueType = pb.QOS_BEST_EFFORT) -> pb.Pod:
    pod = pb.Pod(metadata=pb.ObjectMeta(name=name, uid=f"uid-{name}"))
    pod.spec.node_name, pod.spec.qos = node, qos
    return pod


PODS = {
    p.metadata.name: p
    for p in (
        _pod("be-mine", "nodeagent-0-3"),
        _pod("be-machine", "myhost"),
        _pod("online-mine", "nodeagent-0-3", pb.QOS_GUARANTEED),
        _pod("unspecified-mine", "nodeagent-0-3", pb.QOS_UNSPECIFIED),  # guaranteed
        _pod("be-theirs", "nodeagent-1-0"),
        _pod("pending", ""),
    )
}


def _evict(reason: str, *pods: str, requester: str = "", uid: str = "") -> ipb.EvictRequest:
    request = ipb.EvictRequest(reason=reason, requester=requester)
    for name in pods:
        request.pods.add(name=name, uid=uid)
    return request


@pytest.mark.parametrize(
    ("what", "identity", "request_", "rule"),
    [
        ("agent: its own node's best-effort pod, for the tide", AGENT_0, _evict("Reclaimed", "be-mine", "be-machine", requester="nodeagent/nodeagent-0"), None),
        ("agent: no requester (the Binder writes it)", AGENT_0, _evict("Reclaimed", "be-mine"), None),
        ("agent: a pod on another agent's node", AGENT_0, _evict("Reclaimed", "be-mine", "be-theirs"), "rule evict-own-nodes"),
        ("agent: a pod bound nowhere", AGENT_0, _evict("Reclaimed", "pending"), "rule evict-own-nodes"),
        ("agent: another reason", AGENT_0, _evict("Preempted", "be-mine"), "rule evict-reasons"),
        ("agent: drain", AGENT_0, _evict("Drained", "be-mine"), "rule evict-reasons"),
        ("agent: a guaranteed pod", AGENT_0, _evict("Reclaimed", "online-mine"), "rule evict-best-effort"),
        ("agent: a pod of no stated QoS", AGENT_0, _evict("Reclaimed", "unspecified-mine"), "rule evict-best-effort"),
        ("agent: as another agent", AGENT_0, _evict("Reclaimed", "be-mine", requester="nodeagent/nodeagent-1"), "rule evict-requester"),
        ("agent: as the rescheduler", AGENT_0, _evict("Reclaimed", "be-mine", requester="rescheduler/r"), "rule evict-requester"),
        ("agent: a pod the Binder has not", AGENT_0, _evict("Reclaimed", "gone"), None),
        ("agent: another uid than the pod's", AGENT_0, _evict("Reclaimed", "be-theirs", uid="old"), None),
        ("the shared agent certificate of before", NODEAGENT, _evict("Reclaimed", "be-mine"), "rule evict-own-nodes"),
        ("rescheduler: a movement", RESCHEDULER, _evict("Rescheduled", "be-theirs", requester="rescheduler/r-1"), None),
        ("rescheduler: quota reclaim", RESCHEDULER, _evict("Reclaimed", "be-theirs"), "rule evict-reasons"),
        ("dispatcher: drain", DISPATCHER, _evict("Drained", "online-mine", requester="dispatcher/d"), None),
        ("dispatcher: quota reclaim", DISPATCHER, _evict("Reclaimed", "online-mine"), None),
        ("dispatcher: a movement", DISPATCHER, _evict("Rescheduled", "online-mine"), "rule evict-reasons"),
        ("dispatcher: as the admin", DISPATCHER, _evict("Drained", "online-mine", requester="admin"), "rule evict-requester"),
        ("admin: anything", ADMIN, _evict("Maintenance", "online-mine", "be-theirs"), None),
        ("admin: as a node agent", ADMIN, _evict("Reclaimed", "be-mine", requester="nodeagent/nodeagent-0"), "rule evict-requester"),
        ("insecure cluster: no identity", None, _evict("Whatever", "be-theirs", requester="x"), None),
    ],
)  # fmt: skip
def test_evict_rules(
    what: str, identity: Identity | None, request_: ipb.EvictRequest, rule: str | None
) -> None:
    why = evictrules.refusal(identity, request_, PODS.get)
    if rule is None:
        assert why is None, f"{what}: {why}"
    else:
        assert why is not None and why.startswith(rule), f"{what}: {why}"


NOBODY = pwd.getpwnam("nobody")


@pytest.mark.parametrize(
    ("wanted", "agent_uid", "expected"),
    [
        ("", 0, None),  # a root agent: a uid per pod (tests/test_isolation.py), no shared user
        ("nobody", 0, RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid)),
        (str(NOBODY.pw_uid), 0, RunAs("nobody", NOBODY.pw_uid, NOBODY.pw_gid)),
        ("", 1000, None),  # an unprivileged agent: its own user
        ("nobody", NOBODY.pw_uid, None),
        ("root", 0, "never run as root"),
        ("0", 0, "never run as root"),
        ("no-such-user-here", 0, "no user 'no-such-user-here'"),
        ("nobody", 1000, "needs the node agent to start as root"),
    ],
)
def test_run_as_rules(wanted: str, agent_uid: int, expected: RunAs | str | None) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match=expected):
            resolve_run_as(wanted, agent_uid)
    else:
        assert resolve_run_as(wanted, agent_uid) == expected


async def test_a_service_without_credentials_refuses_to_start_unless_insecure_by_name(
    store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    from services.dispatcher.service import DispatcherService
    from services.runtime.config import load_config

    config = load_config(
        DispatcherService.config_class,
        ["--store-url", store_url, "--cluster", cluster_name, "--home", str(tmp_path)],
        environ={},
    )
    assert not config.insecure
    with pytest.raises(
        StartupError, match=r"--insecure true \(or GODEL_INSECURE=true\) serves without TLS"
    ):
        async with ServiceHost(DispatcherService, config):
            pass
    async with ServiceHost(DispatcherService, replace(config, insecure=True)) as host:
        assert host.service is not None and host.service.credentials is None


async def test_a_service_on_a_directory_of_one_shared_identity_says_to_run_certs_init(
    store_url: str, cluster_name: str, tmp_path: Path
) -> None:
    """A credentials directory from before per-kind identities (only ``service.crt``): the
    service refuses to start and says how to bring it up to date; once that is done, it starts
    with its own kind's identity."""
    from services.dispatcher.service import DispatcherService
    from services.runtime.config import load_config

    directory = tmp_path / "tls"
    pki.init_cluster(directory)
    for kind in tls.SHARED_KINDS:
        (directory / f"{kind}.crt").unlink()
        (directory / f"{kind}.key").unlink()
    config = load_config(
        DispatcherService.config_class,
        ["--store-url", store_url, "--cluster", cluster_name, "--tls-dir", str(directory)],
        environ={},
    )
    with pytest.raises(StartupError, match=r"dispatcher\.crt.*`godel certs init --dir "):
        async with ServiceHost(DispatcherService, config):
            pass
    pki.init_cluster(directory)
    async with ServiceHost(DispatcherService, config) as host:
        assert host.service is not None and host.service.credentials is not None
        assert pki.identity_of(host.service.credentials.certificate) == DISPATCHER


async def test_a_node_agent_starts_only_with_its_own_certificate_naming_its_nodes(
    store_url: str, cluster_name: str, store: Store, tmp_path: Path
) -> None:
    """A node agent serves and dials with ``nodeagent.<name>.crt``: none (a directory of before
    agents had their own) or one naming other nodes stops its start, saying how to issue the
    right one, before it registers a node; with it, it starts as that identity."""
    from services.nodeagent.service import NodeAgentService
    from services.runtime.config import load_config

    directory = tmp_path / "tls"
    pki.init_cluster(directory)
    config = load_config(
        NodeAgentService.config_class,
        ["--store-url", store_url, "--cluster", cluster_name, "--tls-dir", str(directory),
         "--name", "rack-a", "--hollow-nodes", "2", "--home", str(tmp_path)],
        environ={},
    )  # fmt: skip
    with pytest.raises(StartupError, match=r"`godel certs issue rack-a --role nodeagent"):
        async with ServiceHost(NodeAgentService, config):
            pass
    pki.issue_agent(directory, "rack-a", ["rack-b-*"])  # another agent's nodes
    with pytest.raises(
        StartupError,
        match=r"names agent 'rack-a' serving rack-b-\*; this is agent 'rack-a', serving "
        r"rack-a-0, rack-a-1: issue its certificate with `godel certs issue rack-a --role "
        r"nodeagent --node 'rack-a-\*' --force`",
    ):
        async with ServiceHost(NodeAgentService, config):
            pass
    assert (await store.list_all(pb.Node))[0] == [], "a refused agent registers nothing"
    pki.issue_agent(directory, "rack-a", ["rack-a-*"])
    async with ServiceHost(NodeAgentService, config) as host:
        assert host.service is not None and host.service.credentials is not None
        identity = pki.identity_of(host.service.credentials.certificate)
        assert (identity.agent, identity.nodes) == ("rack-a", ("rack-a-*",))


@pytest.mark.parametrize(
    ("address", "named"),
    [
        ("127.0.0.1:50051", True),
        ("[::1]:50051", True),
        ("localhost:50051", True),
        ("LOCALHOST:1", True),
        ("binder:50051", True),  # a --host given to init
        ("10.0.0.7:50051", True),
        (f"{tls.SERVICE_NAME}:50051", True),
        ("10.0.0.8:50051", False),
        ("elsewhere.example:50051", False),
    ],
)
def test_which_advertised_addresses_a_service_certificate_names(
    tmp_path: Path, address: str, named: bool
) -> None:
    pki.init_cluster(tmp_path, ["binder", "10.0.0.7"])
    pem = tls.load(tmp_path, "binder").certificate
    assert pki.names_address(pem, address) is named
