"""`godel certs issue` cannot clobber an identity: the cluster's own (the CA, the services',
the admin's) are never issued by hand, and one issued before is replaced only with --force,
which never touches the CA. Run as a user would, through the CLI, on a directory `godel certs
init` made."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from foundation import pki, tls


def certs(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "godel", "certs", *args, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def cluster_tls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tls")
    assert certs(directory, "init").returncode == 0
    return directory


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.mark.parametrize(
    ("name", "role"),
    [("ca", "tenant"), ("ca", "admin"), ("admin", "tenant"), ("binder", "service"),
     ("service", "service"), ("dispatcher", "tenant")],
)  # fmt: skip
def test_the_clusters_own_identities_are_never_issued_by_hand(
    cluster_tls: Path, name: str, role: str
) -> None:
    before = _files(cluster_tls)
    for extra in ((), ("--force",)):
        result = certs(cluster_tls, "issue", name, "--role", role, *extra)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"{name!r} is one of the cluster's own identities" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback
    assert _files(cluster_tls) == before  # nothing written, the CA key above all


def test_an_identity_issued_before_is_replaced_only_with_force(cluster_tls: Path) -> None:
    assert certs(cluster_tls, "issue", "carol", "--queue", "research").returncode == 0
    first = (cluster_tls / "carol.crt").read_bytes()
    ca_key = (cluster_tls / f"{tls.CA}.key").read_bytes()

    again = certs(cluster_tls, "issue", "carol", "--role", "admin")
    assert again.returncode == 2
    assert "'carol' is already issued" in again.stderr and "--force" in again.stderr
    assert (cluster_tls / "carol.crt").read_bytes() == first

    forced = certs(cluster_tls, "issue", "carol", "--force")
    assert forced.returncode == 0, forced.stderr
    assert (cluster_tls / "carol.crt").read_bytes() != first
    assert (cluster_tls / f"{tls.CA}.key").read_bytes() == ca_key
    identity = pki.identity_of((cluster_tls / "carol.crt").read_bytes())
    assert (identity.name, identity.role) == ("carol", "tenant")


def test_the_library_refuses_to_issue_as_the_ca_whoever_calls_it(cluster_tls: Path) -> None:
    ca_key = (cluster_tls / f"{tls.CA}.key").read_bytes()
    with pytest.raises(tls.CredentialsError, match="names the cluster CA"):
        pki.issue(cluster_tls, "mallory", "tenant", stem=tls.CA)
    assert (cluster_tls / f"{tls.CA}.key").read_bytes() == ca_key


def test_a_node_agent_is_issued_its_own_certificate_naming_its_nodes(cluster_tls: Path) -> None:
    """`godel certs issue NAME --role nodeagent`: nodeagent.NAME.crt, naming the agent and the
    nodes it serves (default: its hollow nodes, NAME-*); kept unless --force, like any other."""
    issued = certs(cluster_tls, "issue", "rack-7", "--role", "nodeagent")
    assert issued.returncode == 0, issued.stderr
    assert "nodes: rack-7-*" in issued.stdout
    identity = pki.identity_of((cluster_tls / "nodeagent.rack-7.crt").read_bytes())
    assert (identity.name, identity.agent, identity.nodes) == ("nodeagent", "rack-7", ("rack-7-*",))

    again = certs(cluster_tls, "issue", "rack-7", "--role", "nodeagent", "--node", "x-*")
    assert again.returncode == 2 and "'rack-7' is already issued" in again.stderr
    forced = certs(
        cluster_tls, "issue", "rack-7", "--role", "nodeagent", "--node", "rack-7-*",
        "--node", "gpu-box", "--force",
    )  # fmt: skip
    assert forced.returncode == 0, forced.stderr
    identity = pki.identity_of((cluster_tls / "nodeagent.rack-7.crt").read_bytes())
    assert identity.nodes == ("rack-7-*", "gpu-box")
    # An agent named like a service kind is still an agent: its file is its own.
    named = certs(cluster_tls, "issue", "nodeagent", "--role", "nodeagent")
    assert named.returncode == 0, named.stderr
    assert not (cluster_tls / "nodeagent.crt").exists()


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("--node", "x-*"), "--node is for node agents (--role nodeagent)"),
        (("--role", "nodeagent", "--node", "*"), "node '*' must be a node's name"),
        (("--role", "nodeagent", "--queue", "q"), "--queue is for tenants"),
        (("--role", "agent"), "--role must be one of service, admin, tenant, nodeagent"),
    ],
)
def test_issue_refuses_bad_agent_requests_in_one_line_writing_nothing(
    cluster_tls: Path, args: tuple[str, ...], error: str
) -> None:
    before = _files(cluster_tls)
    result = certs(cluster_tls, "issue", "rack-9", *args)
    assert result.returncode != 0 and error in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert _files(cluster_tls) == before


def test_init_issues_the_agents_it_is_told_of_and_keeps_them(tmp_path: Path) -> None:
    """As compose's certs service runs it on every `up`: the agent's certificate once, then
    kept while it names the same nodes."""
    first = certs(tmp_path, "init", "--agent", "edge=edge-*,edge-box", "--agent", "core")
    assert first.returncode == 0, first.stderr
    edge = pki.identity_of((tmp_path / "nodeagent.edge.crt").read_bytes())
    core = pki.identity_of((tmp_path / "nodeagent.core.crt").read_bytes())
    assert (edge.agent, edge.nodes) == ("edge", ("edge-*", "edge-box"))
    assert (core.agent, core.nodes) == ("core", ("core-*",))
    before = _files(tmp_path)
    again = certs(tmp_path, "init", "--agent", "edge=edge-*,edge-box", "--agent", "core")
    assert again.returncode == 0 and "issued" not in again.stdout
    assert _files(tmp_path) == before
    empty = certs(tmp_path, "init", "--agent", "edge=")
    assert empty.returncode != 0 and "--agent 'edge='" in empty.stderr
