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
