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
from protos.godel.v1 import objects_pb2 as pb
from services import events, tenancy
from services.nodeagent.runner import RunAs, resolve_run_as
from services.runtime import ServiceHost, StartupError
from services.runtime.auth import refusal

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
    stems = ("ca", "service", *tls.SERVICE_KINDS, "admin", "alice")
    assert {p.name for p in tmp_path.iterdir()} == {
        f"{stem}.{ext}" for stem in stems for ext in ("crt", "key")
    }
    assert all(p.stat().st_mode & 0o077 == 0 for p in tmp_path.iterdir()), "private to owner"
    cases = [("service", SERVICE), ("admin", ADMIN), ("alice", ALICE)]
    cases += [(kind, Identity(kind, "service")) for kind in tls.SERVICE_KINDS]
    for stem, identity in cases:
        assert pki.identity_of(tls.load(tmp_path, stem).certificate) == identity, stem
    service = x509.load_pem_x509_certificate((tmp_path / "service.crt").read_bytes())
    names = service.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    dns = names.get_values_for_type(x509.DNSName)
    ips = [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    assert {tls.SERVICE_NAME, "localhost", "dispatcher"} <= set(dns)
    assert {"127.0.0.1", "10.0.0.7"} <= set(ips)
    for kind in tls.SERVICE_KINDS:  # each kind's certificate names every address too
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
    for kind in tls.SERVICE_KINDS:  # the layout of an older release: one service identity
        (tmp_path / f"{kind}.crt").unlink()
        (tmp_path / f"{kind}.key").unlink()
    assert pki.init_cluster(tmp_path, ["binder"]) == list(tls.SERVICE_KINDS)
    assert {stem: (tmp_path / f"{stem}.crt").read_bytes() for stem in kept} == kept
    assert pki.identity_of(tls.load(tmp_path, "binder").certificate) == BINDER


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
        ("tenant applies", lambda: tenancy.apply_refusal(ALICE), "rule admin-only"),
        ("owner reads the event about its pod", lambda: tenancy.read_refusal(ALICE, "Event", ALICES_EVENT), None),
        ("other tenant reads the event about it", lambda: tenancy.read_refusal(BOB, "Event", ALICES_EVENT), "rule own-jobs-only"),
        ("tenant reads the cluster's own event", lambda: tenancy.read_refusal(ALICE, "Event", NODES_EVENT), "rule own-jobs-only"),
        ("admin reads any event", lambda: tenancy.read_refusal(ADMIN, "Event", ALICES_EVENT), None),
        ("owner deletes the event about its pod", lambda: tenancy.delete_refusal(ALICE, "Event", ALICES_EVENT), "rule admin-only"),
        ("tenant drains a node", lambda: tenancy.drain_refusal(ALICE), "rule admin-only"),
        ("admin drains a node", lambda: tenancy.drain_refusal(ADMIN), None),
        ("anyone drains on an insecure cluster", lambda: tenancy.drain_refusal(None), None),
        ("admin applies", lambda: tenancy.apply_refusal(ADMIN), None),
    ],
)  # fmt: skip
def test_tenancy_rules(what: str, refusal_of: object, rule: str | None) -> None:
    why = refusal_of()  # type: ignore[operator]
    if rule is None:
        assert why is None, what
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
    for kind in tls.SERVICE_KINDS:
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
