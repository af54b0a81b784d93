"""`godel apply -f` / `godel delete -f` given what is not a manifest — a binary file, text that
is not UTF-8, labels that break Kubernetes' label syntax — say so on one line naming the file
and the problem, exit non-zero, and store nothing: the CLI (a real process) against a real
dispatcher in-process on a real store."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from store import Store
from tests.dispatcher_harness import Running, dispatcher_config, run_dispatcher

ROOT = Path(__file__).resolve().parent.parent
JOB = b"apiVersion: godel/v1\nkind: Job\nmetadata: {name: web}\nspec: {template: {requests: {cpu: 100m}}}\n"  # fmt: skip


@pytest.fixture
async def dispatcher(store_url: str, cluster_name: str, tmp_path: Path) -> AsyncIterator[Running]:
    async with run_dispatcher(dispatcher_config(store_url, cluster_name, tmp_path)) as running:
        yield running


async def godel(dispatcher: Running, *args: str, stdin: bytes = b"") -> tuple[int, str]:
    """The exit code and stderr of the CLI run in a process of its own."""
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "godel", *args, "--server", dispatcher.host.address],
        input=stdin,
        capture_output=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "GODEL_INSECURE": "true"},  # the in-process dispatcher is plaintext
    )
    return result.returncode, result.stderr.decode()


NOT_MANIFESTS: list[tuple[str, bytes, str]] = [
    # (case, the file's bytes, its one-line error after "error: <file>: ")
    ("a byte that is not UTF-8", JOB.replace(b"web", b"w\xffb"),
     "not UTF-8 text (byte 0xff at offset 49, line 3)"),
    ("binary", bytes(range(256)) * 4, "not UTF-8 text (byte 0x80 at offset 128, line 2)"),
    ("NUL bytes", b"\x00" * 64, "not text (control character #x00 at line 1, column 1)"),
    ("latin-1 text", "metadata: {name: café}\n".encode("latin-1"),
     "not UTF-8 text (byte 0xe9 at offset 20, line 1)"),
    ("a label key with spaces", JOB.replace(b"{name: web}", b"{name: web, labels: {'has spaces!': x}}"),
     "[0] metadata.labels['has spaces!']: 'has spaces!' is not a valid label key"),
    ("a label value of 70 characters",
     JOB.replace(b"{name: web}", b"{name: web, labels: {team: " + b"v" * 70 + b"}}"),
     "[0] metadata.labels['team']: a label value must be at most 63 characters (got 70)"),
    ("a label key a/b/c", JOB.replace(b"{name: web}", b"{name: web, labels: {a/b/c: x}}"),
     "[0] metadata.labels['a/b/c']: 'a/b/c': prefix 'a/b' is not a DNS-1123 subdomain"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "problem"), [c[1:] for c in NOT_MANIFESTS], ids=[c[0] for c in NOT_MANIFESTS]
)
async def test_apply_of_what_is_not_a_manifest_is_one_line_naming_the_file(
    dispatcher: Running, store: Store, tmp_path: Path, data: bytes, problem: str
) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    before = await store.revision()
    code, stderr = await godel(dispatcher, "apply", "-f", str(path))
    assert code != 0
    assert stderr.startswith(f"error: {path}{'' if problem.startswith('[') else ': '}{problem}")
    assert stderr.count("\n") == 1, stderr  # one line, no traceback
    # Stdin is read as a file is; a valid file beside the bad one is not applied either.
    good = tmp_path / "good.yaml"
    good.write_bytes(JOB)
    code, stderr = await godel(dispatcher, "apply", "-f", str(good), "-f", "-", stdin=data)
    assert code != 0 and stderr.startswith("error: <stdin>") and stderr.count("\n") == 1, stderr
    code, stderr = await godel(dispatcher, "delete", "-f", str(path))
    assert code != 0 and stderr.startswith(f"error: {path}") and stderr.count("\n") == 1, stderr
    assert await store.revision() == before  # nothing stored


async def test_a_file_that_cannot_be_read_is_named(dispatcher: Running, tmp_path: Path) -> None:
    code, stderr = await godel(dispatcher, "apply", "-f", str(tmp_path))
    assert code != 0 and stderr == f"error: {tmp_path}: cannot read: Is a directory\n"
