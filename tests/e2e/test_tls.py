"""Authentication and authorisation on a real `godel up` cluster: every service refuses callers
without the cluster's credentials, internal RPCs refuse client identities, tenants are held to
their queues and their own jobs (the rules, refusals naming them), process-mode pods run each as
a uid of its own and one tenant's pod cannot reach another's, and `godel up --insecure` runs —
and says so."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import psutil
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from foundation import pki, tls
from godel.client import (
    ClientError,
    GodelClient,
    PermissionDenied,
    ProtoClient,
    ReschedulerClient,
    Unauthenticated,
    job,
    logs,
)
from godel.client._transport import client_error
from protos.godel.v1 import internal_pb2, internal_pb2_grpc
from protos.godel.v1 import objects_pb2 as pb
from services.nodeagent.isolation import DEFAULT_UID_RANGE, parse_uid_range
from tests import factories as f
from tests.e2e.conftest import Cluster, wait_until

pytestmark = pytest.mark.e2e

PROCESS = {"godel.io/mode": "process"}
QUEUES = "apiVersion: godel/v1\nkind: Queue\nmetadata: {name: research}\n---\n" + (
    "apiVersion: godel/v1\nkind: Queue\nmetadata: {name: batch}\n"
)


def health(address: str, credentials: tls.Credentials | None) -> grpc.StatusCode:
    """The code of one Health.Check — a method every identity of the cluster may call, so only
    authentication decides."""
    with tls.channel(address, credentials) as channel:
        try:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        except grpc.RpcError as exc:
            code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
            return code
    return grpc.StatusCode.OK


def roleless_certificate(tls_dir: Path, out: Path) -> tls.Credentials:
    """Signed by the cluster's own CA, but naming no role: authenticated by TLS, yet no
    identity of the cluster."""
    ca_cert = x509.load_pem_x509_certificate((tls_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((tls_dir / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mallory")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    out.mkdir()
    pem_key = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return tls.Credentials(
        (tls_dir / "ca.crt").read_bytes(), cert.public_bytes(serialization.Encoding.PEM), pem_key
    )


def test_every_service_refuses_callers_without_the_clusters_credentials(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2)
    tls_dir = cluster.home.tls_dir
    admin = tls.load(tls_dir, tls.ADMIN)
    pki.init_cluster(tmp_path / "other")
    others = tls.load(tmp_path / "other", tls.ADMIN)  # a certificate of another cluster's CA
    roleless = roleless_certificate(tls_dir, tmp_path / "roleless")
    services = [c for c in cluster.state.components if c.kind != "store"]
    assert {c.kind for c in services} == {
        "dispatcher", "scheduler", "binder", "rescheduler", "nodeagent",
    }  # fmt: skip
    for component in services:
        address = component.address
        assert health(address, admin) == grpc.StatusCode.OK, component.name
        # No TLS at all, or a certificate from another CA: the handshake fails, no call runs.
        assert health(address, None) == grpc.StatusCode.UNAVAILABLE, component.name
        with tls.channel(address, others) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            # ... which the SDK reports for what it is.
            assert isinstance(client_error(caught.value, address), Unauthenticated)
        # The cluster's CA, but no identity in it: UNAUTHENTICATED, from the service itself.
        assert health(address, roleless) == grpc.StatusCode.UNAUTHENTICATED, component.name
    # The SDK with another cluster's certificate: a typed, clear error.
    with pytest.raises(Unauthenticated, match="handshake"):
        ProtoClient(cluster.state.address_of("dispatcher"), credentials=others).list("Node")
    # The public API stays reachable by the CLI and the SDK, credentials found in the home.
    assert "nodeagent-0-0" in cluster.godel("get", "nodes").stdout
    with GodelClient() as client:
        assert len(client.list("Node")) == 2


def test_internal_rpcs_admit_only_the_service_kinds_that_call_them(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2)
    cluster.godel("certs", "issue", "alice", "--queue", "research")
    binder = cluster.state.address_of("binder")
    shard = cluster.state.address_of("scheduler")
    evict = (
        binder,
        "evict",
        lambda ch: internal_pb2_grpc.BinderStub(ch).Evict(internal_pb2.EvictRequest(), timeout=10),
    )
    decide = (
        binder,
        "decide",
        lambda ch: next(
            iter(
                internal_pb2_grpc.BinderStub(ch).Decide(
                    iter([internal_pb2.DecisionBatch()]), timeout=10
                )
            )
        ),
    )
    dispatch = (
        shard,
        "dispatch",
        lambda ch: next(iter(internal_pb2_grpc.SchedulerStub(ch).Dispatch(iter([]), timeout=10))),
    )
    agent = tls.agent_stem("nodeagent-0")  # a node agent's own certificate
    refused: list[tuple[str, tuple[str, str, Callable[[grpc.Channel], object]]]] = [
        (tls.ADMIN, decide), (tls.ADMIN, dispatch),
        ("alice", evict), ("alice", decide), ("alice", dispatch),
        # Services of the cluster, but not the kinds that make these calls.
        ("dashboard", evict), (agent, decide), ("dispatcher", decide),
        ("scheduler", evict), ("rescheduler", dispatch), (tls.SERVICE, decide),
    ]  # fmt: skip
    for identity, (address, rule, call) in refused:
        with tls.channel(address, tls.load(cluster.home.tls_dir, identity)) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                call(channel)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, identity  # type: ignore[attr-defined]
        assert f"rule {rule}" in caught.value.details(), caught.value.details()  # type: ignore[attr-defined]
    # The kinds that evict pass the rule (an empty eviction is answered by the Binder).
    for identity in ("rescheduler", agent, "dispatcher", tls.ADMIN):
        with tls.channel(binder, tls.load(cluster.home.tls_dir, identity)) as channel:
            try:
                internal_pb2_grpc.BinderStub(channel).Evict(internal_pb2.EvictRequest(), timeout=10)
            except grpc.RpcError as exc:
                assert exc.code() not in (  # type: ignore[attr-defined]
                    grpc.StatusCode.PERMISSION_DENIED,
                    grpc.StatusCode.UNAUTHENTICATED,
                ), (identity, exc)


def test_node_agents_have_their_own_identities_and_evict_only_best_effort_pods_of_their_nodes(
    make_cluster: Callable[..., Cluster], tmp_path: Path
) -> None:
    """`godel up` on a home from before node agents had their own certificates: each agent is
    issued its own (naming its nodes) and the one they shared is removed. Then the attacks one
    agent's certificate made on the Binder before — evicting any pod anywhere, for any reason,
    as anyone — each refused, naming the rule, evicting nothing; and the eviction tidal
    pressure needs still done, signed by the agent."""
    tls_dir = tmp_path / "home0" / "tls"  # where make_cluster puts its first home
    pki.init_cluster(tls_dir)
    pki.issue(tls_dir, tls.NODEAGENT, "service")  # the certificate every agent shared before
    shared = tls.load(tls_dir, tls.NODEAGENT)
    cluster = make_cluster(schedulers=1, binders=1, nodeagents=2, hollow_nodes=4)
    assert not (tls_dir / f"{tls.NODEAGENT}.crt").exists()
    agent_a = tls.load(tls_dir, tls.agent_stem("nodeagent-0"))
    assert pki.identity_of(agent_a.certificate).nodes == ("nodeagent-0-*",)

    # nodeagent-0 serves nodeagent-0-0 and -1, nodeagent-1 the nodeagent-1-* ones.
    placed = {
        "be-a": ("nodeagent-0-0", "best-effort", 0),
        "online-a": ("nodeagent-0-0", "", 0),
        "be-b": ("nodeagent-1-0", "best-effort", 0),
        "vip-b": ("nodeagent-1-0", "", 1000),  # high priority, not preemptible
    }
    for name, (node, qos, priority) in placed.items():
        work = job(
            name, cpu="100m", memory="64Mi", qos=qos, priority=priority,
            preemptible=False if priority else None, node_selector={"hostname": node},
        )  # fmt: skip
        assert cluster.client.submit([work.to_proto()]).results[0].created

    def running() -> dict[str, str]:
        pods = [cluster.client.get("Pod", f"{name}-0") for name in placed]
        return {
            p.metadata.name: p.spec.node_name  # type: ignore[attr-defined]
            for p in pods
            if p.status.phase == pb.POD_RUNNING  # type: ignore[attr-defined]
        }

    wait_until(lambda: len(running()) == len(placed), what="every pod running")
    binder = cluster.state.address_of("binder")

    def evict(
        credentials: tls.Credentials, reason: str, pod: str, requester: str = ""
    ) -> internal_pb2.EvictResponse:
        request = internal_pb2.EvictRequest(reason=reason, requester=requester, partial=True)
        request.pods.add(name=pod)
        with tls.channel(binder, credentials) as channel:
            response: internal_pb2.EvictResponse = internal_pb2_grpc.BinderStub(channel).Evict(
                request, timeout=30
            )
            return response

    attacks = [
        ("a pod on another agent's node", agent_a, "Reclaimed", "vip-b-0", "", "evict-own-nodes"),
        ("a best-effort pod there", agent_a, "Reclaimed", "be-b-0", "", "evict-own-nodes"),
        ("its own node's pod, as preemption", agent_a, "Preempted", "be-a-0", "", "evict-reasons"),
        ("its own node's guaranteed pod", agent_a, "Reclaimed", "online-a-0", "", "evict-best-effort"),
        ("as the rescheduler", agent_a, "Reclaimed", "be-a-0", "rescheduler/r", "evict-requester"),
        ("as the other agent", agent_a, "Reclaimed", "be-a-0", "nodeagent/nodeagent-1", "evict-requester"),
        ("with the shared certificate of before", shared, "Reclaimed", "be-b-0", "", "evict-own-nodes"),
    ]  # fmt: skip
    for what, credentials, reason, pod, requester, rule in attacks:
        with pytest.raises(grpc.RpcError) as caught:
            evict(credentials, reason, pod, requester)
        code, details = caught.value.code(), caught.value.details()  # type: ignore[attr-defined]
        assert code == grpc.StatusCode.PERMISSION_DENIED, (what, code, details)
        assert details.startswith(f"rule {rule}:"), (what, details)
    assert running() == {name + "-0": node for name, (node, _, _) in placed.items()}

    # What tidal pressure asks: its own node's best-effort pod, Reclaimed; the Binder signs it.
    (result,) = evict(agent_a, "Reclaimed", "be-a-0").results
    assert result.outcome == internal_pb2.EvictResult.EVICTED, result
    evicted = cluster.client.get("Pod", "be-a-0")
    assert evicted.status.reason == "Reclaimed"  # type: ignore[attr-defined]
    assert evicted.status.message == "evicted by nodeagent/nodeagent-0"  # type: ignore[attr-defined]


def test_tenants_keep_to_their_queues_and_their_own_jobs_and_their_pods_run_apart(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, process_node=True)
    wait_until(lambda: len(cluster.client.list("Node")) == 3, what="nodes registered")
    cluster.godel("apply", "-f", "-", stdin=QUEUES)
    cluster.godel("certs", "issue", "alice", "--queue", "research")
    cluster.godel("certs", "issue", "bob", "--queue", "batch")
    address = cluster.state.address_of("dispatcher")

    def as_(name: str) -> ProtoClient:
        return ProtoClient(address, credentials=tls.load(cluster.home.tls_dir, name))

    alice, bob = as_("alice"), as_("bob")
    work = job(
        "alice-work", cpu="100m", memory="64Mi", queue="research", node_selector=PROCESS,
        command=["sh", "-c", "echo secret > secret; echo started; exec sleep 120"],
    )  # fmt: skip
    result = alice.submit([work.to_proto()]).results[0]
    assert result.created, result
    stored = cluster.client.get("Job", "alice-work")
    assert isinstance(stored, pb.Job) and stored.metadata.owner == "alice"
    pods = alice.list("Pod", job="alice-work")
    assert [p.metadata.owner for p in pods] == ["alice"]  # type: ignore[attr-defined]

    queue = pb.Queue(metadata=pb.ObjectMeta(name="mine"))
    bobs_job = job("bob-sneaks", queue="research").to_proto()
    refusals: list[tuple[str, Callable[[], object], str]] = [
        ("submit to another's queue", lambda: bob.submit([bobs_job]), "rule tenant-queues"),
        ("read another's job", lambda: bob.get("Job", "alice-work"), "rule own-jobs-only"),
        ("read another's pod", lambda: bob.get("Pod", "alice-work-0"), "rule own-jobs-only"),
        ("explain another's pod", lambda: bob.explain("alice-work-0"), "rule own-jobs-only"),
        ("delete another's job", lambda: bob.delete("Job", "alice-work"), "rule own-jobs-only"),
        ("apply a queue", lambda: bob.apply([("Queue", queue)]), "rule admin-only"),
        ("delete a node", lambda: bob.delete("Node", "nodeagent-0-0"), "rule admin-only"),
        ("drain a node", lambda: bob.drain("nodeagent-0-0"), "rule admin-only"),
        ("list a node's pods by a dry-run drain",
         lambda: bob.drain("nodeagent-0-0", dry_run=True), "rule admin-only"),
        ("trigger rescheduling",
         lambda: ReschedulerClient(cluster.state.address_of("rescheduler"),
                                   credentials=bob.credentials).trigger(dry_run=True),
         "rule admin-only"),
    ]  # fmt: skip
    for what, call, rule in refusals:
        with pytest.raises(PermissionDenied) as caught:
            call()
        assert rule in str(caught.value), f"{what}: {caught.value}"
    # The refused drain touched nothing: the node is still schedulable.
    drained = cluster.client.get("Node", "nodeagent-0-0")
    assert isinstance(drained, pb.Node) and not drained.spec.unschedulable
    # Lists leave out what is not the caller's; the admin sees everything.
    assert bob.list("Job") == [] and bob.list("Pod", job="alice-work") == []
    assert [j.metadata.name for j in alice.list("Job")] == ["alice-work"]  # type: ignore[attr-defined]
    assert len(bob.list("Node")) == 3  # the cluster's shape is not secret
    # The CLI picks the identity from GODEL_IDENTITY, and prints the rule.
    refused = subprocess.run(
        [sys.executable, "-m", "godel", "get", "job", "alice-work"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "GODEL_HOME": str(cluster.home.path), "GODEL_IDENTITY": "bob"},
    )  # fmt: skip
    assert refused.returncode != 0 and "rule own-jobs-only" in refused.stderr, refused.stderr

    # The pod's process: a uid of its own from the agent's default range, in its own work dir.
    wait_until(
        lambda: alice.get("Pod", "alice-work-0").status.phase == pb.POD_RUNNING,  # type: ignore[attr-defined]
        what="the process pod running",
    )
    agent = cluster.component("nodeagent-0").process()
    assert agent is not None
    work_dir = cluster.home.path / "pods" / "alice-work-0"

    def pod_process() -> psutil.Process | None:
        for child in agent.children(recursive=True):
            try:
                if child.cwd() == str(work_dir) and child.name() == "sleep":
                    return child
            except psutil.Error:
                continue
        return None

    proc = wait_until(pod_process, what="the pod's sleep process")
    status = Path(f"/proc/{proc.pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    gids = next(line for line in status.splitlines() if line.startswith("Gid:")).split()[1:]
    own = int(uids[0])
    assert own in parse_uid_range(DEFAULT_UID_RANGE)
    assert uids == [str(own)] * 4 and gids == [str(own)] * 4
    assert work_dir.stat().st_uid == own

    # Bob's pod, on the same node, goes for hers: nothing of it works.
    attack = job(
        "bob-attack", cpu="100m", memory="64Mi", queue="batch", node_selector=PROCESS,
        command=["sh", "-c", f.POD_ATTACK],
        env={"TARGET": str(proc.pid), "AGENT_DIR": str(work_dir.parent),
             "VICTIM_LOG": str(work_dir.parent / "alice-work-0.log")},
    )  # fmt: skip
    assert bob.submit([attack.to_proto()]).results[0].created
    wait_until(
        lambda: bob.get(pb.Pod, "bob-attack-0").status.phase in (pb.POD_SUCCEEDED, pb.POD_FAILED),
        what="bob's attack over",
    )
    said = b"".join(logs(cluster.state.address_of("nodeagent"), "bob-attack-0",
                         credentials=bob.credentials)).decode().splitlines()  # fmt: skip
    assert said[-1] == "attack over" and int(said[0]) != own, said
    assert [line for line in said if line.startswith("ATTACK-")] == []
    assert proc.is_running()
    assert (work_dir / "secret").read_text() == "secret\n"

    # Its logs: the owner reads them through the node agent, another tenant may not.
    agent_address = cluster.state.address_of("nodeagent")
    wait_until(
        lambda: b"started" in b"".join(logs(agent_address, "alice-work-0",
                                            credentials=alice.credentials)),
        what="the owner reads the pod's log",
    )  # fmt: skip
    with pytest.raises(PermissionDenied, match="rule own-jobs-only"):
        b"".join(logs(agent_address, "alice-work-0", credentials=bob.credentials))
    assert alice.delete("Job", "alice-work") == 2
    for client in (alice, bob):
        client.close()


def test_tenants_read_only_the_events_about_their_own_pods(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A drain evicts both tenants' pods; each eviction's event belongs to its pod's owner:
    the owner lists and reads it, the other tenant neither lists nor reads it, the admin sees
    them all."""
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, process_node=False)
    wait_until(lambda: len(cluster.client.list("Node")) == 2, what="nodes registered")
    cluster.godel("apply", "-f", "-", stdin=QUEUES)
    cluster.godel("certs", "issue", "alice", "--queue", "research")
    cluster.godel("certs", "issue", "bob", "--queue", "batch")
    address = cluster.state.address_of("dispatcher")
    alice, bob = (
        ProtoClient(address, credentials=tls.load(cluster.home.tls_dir, name))
        for name in ("alice", "bob")
    )
    for client, name, queue in ((alice, "alice-w", "research"), (bob, "bob-w", "batch")):
        assert client.submit([job(name, cpu="100m", memory="64Mi", queue=queue).to_proto()])
    nodes: set[str] = set()
    for name in ("alice-w-0", "bob-w-0"):
        wait_until(lambda n=name: cluster.client.get("Pod", n).spec.node_name, what=f"{name} bound")  # type: ignore[attr-defined]
        nodes.add(cluster.client.get("Pod", name).spec.node_name)  # type: ignore[attr-defined]
    for node in nodes:
        cluster.client.drain(node)

    def about(events: list[pb.Event], pod: str) -> list[pb.Event]:
        return [e for e in events if e.reason == "Drained" and e.regarding.name == pod]

    def listed(client: ProtoClient) -> list[pb.Event]:
        return client.list(pb.Event)

    wait_until(
        lambda: (
            about(listed(cluster.client), "alice-w-0") and about(listed(cluster.client), "bob-w-0")
        ),
        what="the admin sees both evictions' events",
    )
    alices, bobs = listed(alice), listed(bob)
    assert about(alices, "alice-w-0") and not about(alices, "bob-w-0")
    assert about(bobs, "bob-w-0") and not about(bobs, "alice-w-0")
    assert {e.metadata.owner for e in alices} == {"alice"}
    assert {e.metadata.owner for e in bobs} == {"bob"}
    alices_event = about(alices, "alice-w-0")[0].metadata.name
    assert alice.get("Event", alices_event).metadata.name == alices_event  # type: ignore[attr-defined]
    with pytest.raises(PermissionDenied) as caught:
        bob.get("Event", alices_event)
    assert "rule own-jobs-only" in str(caught.value)
    for client in (alice, bob):
        client.close()


def test_insecure_cluster_runs_and_status_says_so_loudly(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(schedulers=1, binders=1, hollow_nodes=2, insecure=True)
    assert not (cluster.home.tls_dir / "ca.crt").exists()
    for component in cluster.state.components:
        if component.kind != "store":
            assert health(component.address, None) == grpc.StatusCode.OK, component.name
    status = cluster.godel("status")
    assert "INSECURE" in status.stderr and "SERVING" in status.stdout
    # The CLI and the SDK follow the cluster: plaintext, as it was started.
    assert "nodeagent-0-0" in cluster.godel("get", "nodes").stdout
    with GodelClient() as client:
        gang = client.submit(job("plain", replicas=2, cpu="100m", memory="64Mi"))
        assert gang.wait("Running", timeout=90).phase in ("Running", "Succeeded")
        assert gang.delete() == 3
    with pytest.raises(ClientError):
        # A client insisting on TLS cannot talk to it.
        ProtoClient(
            cluster.state.address_of("dispatcher"),
            credentials=tls.load(_fresh_ca(cluster.home.path / "elsewhere"), tls.ADMIN),
            timeout=5,
        ).list("Node")


def _fresh_ca(directory: Path) -> Path:
    pki.init_cluster(directory)
    return directory
