"""`docker compose up --scale scheduler=4` without a Docker engine: docker-compose.yml's services
started as compose starts them (tests/e2e/compose.py says what is emulated and what is not), a job
scheduled through the dispatcher's published port, and `godel logs` with no local cluster state.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from foundation import tls
from godel.client import ProtoClient
from protos.godel.v1 import objects_pb2 as pb
from services.runtime.healthcheck import probe
from store import Store, StoreError
from tests.e2e.compose import Deployment, compose_up
from tests.e2e.conftest import wait_until

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]

SHARDS = 4
GRPC_PORT = 50051  # every godel container's port, as the file gives it
HOLLOW_NODES = 100  # the node agent's default: the file sets no GODEL_HOLLOW_NODES
# Several jobs at once: a unit never splits across shards, and the dispatcher hands each ready
# unit to the least-loaded shard, so many units are what spread work over the shards.
JOBS, PODS_PER_JOB = 12, 3


def _jobs_yaml() -> str:
    job = """apiVersion: godel/v1
kind: Job
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  minMember: {replicas}
  template:
{extra}    requests: {{cpu: 100m, memory: 64Mi}}
"""
    spread = [job.format(name=f"spread-{i}", replicas=PODS_PER_JOB, extra="") for i in range(JOBS)]
    hello = job.format(
        name="hello",
        replicas=1,
        extra="    nodeSelector: {godel.io/mode: process}\n    command: [sh, -c, 'echo hello']\n",
    )
    return "---\n".join([*spread, hello])


def _godel(server: str, home: Path, *args: str, stdin: str | None = None) -> str:
    """The real CLI on the "Docker host": only the published port, and a GODEL_HOME holding
    nothing but the credentials copied out of the certs volume, so nothing can come from a local
    cluster.json."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GODEL_")}
    result = subprocess.run(
        [sys.executable, "-m", "godel", *args, "--server", server],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "GODEL_HOME": str(home)},
    )
    assert result.returncode == 0, f"godel {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def _quickstart(address: str, home: Path) -> str:
    """examples/sdk_quickstart.py as a user runs it against a deployment: GODEL_ADDRESS set, the
    cluster's credentials in the default place of GODEL_HOME (~/.godel/tls)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GODEL_")}
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sdk_quickstart.py")],
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "GODEL_HOME": str(home), "GODEL_ADDRESS": address, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, f"the quickstart failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def _binder_lease(deployment: Deployment) -> pb.Lease | None:
    async def read() -> pb.Lease | None:
        password = (deployment.volume("store-secrets") / "service.secret").read_text().strip()
        url = f"redis://godel:{password}@{deployment.of('store')[0].ip}:6379/0"
        store = await Store.connect(url)
        try:
            return await store.get_lease("binder")
        finally:
            await store.close()

    return asyncio.run(read())


def _store_refuses_strangers(deployment: Deployment) -> bool:
    async def connect() -> bool:
        try:
            store = await Store.connect(f"redis://{deployment.of('store')[0].ip}:6379/0")
        except StoreError:
            return True
        await store.close()
        return False

    return asyncio.run(connect())


def test_compose_up_scale_scheduler_4_schedules_through_the_published_port(
    tmp_path: Path,
) -> None:
    with compose_up(tmp_path / "compose", scale={"scheduler": SHARDS}) as deployment:
        api = deployment.published[GRPC_PORT]
        replicas = {f"{r.ip}:{GRPC_PORT}" for r in deployment.of("scheduler")}
        assert len(replicas) == SHARDS
        # `docker compose cp certs:/certs/. ~/.godel/tls`: the init service's credentials, which
        # every service serves with, are all the host needs besides the address.
        home = tmp_path / "cli-home"  # no local cluster state
        shutil.copytree(deployment.volume("certs"), home / "tls")
        with ProtoClient(api, home=home) as client:
            # Every shard publishes its own replica's address, and it answers there.
            def ready_instances() -> list[pb.SchedulerInstance] | None:
                listed = client.list("SchedulerInstance")
                ready = [i for i in listed if i.status.ready]  # type: ignore[attr-defined]
                return ready if len(ready) == SHARDS else None  # type: ignore[return-value]

            instances = wait_until(ready_instances, timeout=90, what=f"{SHARDS} ready shards")
            addresses = sorted(i.spec.address for i in instances)  # type: ignore[attr-defined]
            assert addresses == sorted(replicas), "each shard advertises its replica's address"
            admin = client.credentials
            assert all(
                probe(a, "godel.v1.Scheduler", credentials=admin) == "SERVING" for a in addresses
            )
            assert probe(api, credentials=None) == "UNAUTHENTICATED", "plaintext is refused"
            lease = _binder_lease(deployment)
            binders = {f"{r.ip}:{GRPC_PORT}" for r in deployment.of("binder")}
            assert lease is not None and lease.holder_address in binders
            # The store is locked: the services got in with the volume's secret, nobody else does.
            assert _store_refuses_strangers(deployment)

            wait_until(
                lambda: len(client.list("Node")) == HOLLOW_NODES + 1,
                timeout=90,
                what="the node agent's nodes",
            )
            agents = {n.spec.agent_address for n in client.list("Node")}  # type: ignore[attr-defined]
            assert agents == {f"{deployment.of('nodeagent')[0].ip}:{GRPC_PORT}"}

            created = _godel(api, home, "apply", "-f", "-", stdin=_jobs_yaml())
            assert created.count(" created") == JOBS + 1, created

            def bound_pods() -> list[pb.Pod] | None:
                listed = [p for p in client.list("Pod") if p.metadata.name.startswith("spread-")]  # type: ignore[attr-defined]
                done = len(listed) == JOBS * PODS_PER_JOB and all(
                    p.spec.node_name  # type: ignore[attr-defined]
                    for p in listed
                )
                return listed if done else None  # type: ignore[return-value]

            pods = wait_until(bound_pods, timeout=120, what="every pod bound")
            shards = {p.status.scheduler for p in pods}
            names = {i.metadata.name for i in instances}
            assert shards <= names, shards - names
            assert len(shards) > 1, f"every unit went to one shard: {shards}"

            # `godel logs` finds the agent through the address it publishes on its node: from
            # inside the compose network (agents' hostnames resolve there, not on the Docker
            # host), as `docker compose exec dispatcher godel logs hello-0`, its server coming
            # from the file's GODEL_SERVER; and from here, which reaches the emulated agent.
            wait_until(
                lambda: client.get("Pod", "hello-0").status.phase == pb.POD_SUCCEEDED,  # type: ignore[attr-defined]
                timeout=90,
                what="hello-0 succeeded",
            )
            inside = deployment.exec("dispatcher", "godel", "logs", "hello-0")
            assert (inside.returncode, inside.stdout) == (0, "hello\n"), inside.stderr
            assert _godel(api, home, "logs", "hello-0") == "hello\n"

            # The SDK program written against `godel up` runs unchanged here: the credentials
            # copied out once, and one variable naming the deployment.
            out = _quickstart(api, home)
            assert f"cluster: {api}" in out
            assert "job/quickstart-train: Running" in out and "job/quickstart-web: Running" in out
            assert out.count("pod/quickstart-train-") == 4 and "job/quickstart-web deleted" in out
            assert not [j for j in client.list("Job") if j.metadata.name.startswith("quickstart")]  # type: ignore[attr-defined]

            # The dashboard and the singletons' metrics, through their published host ports:
            # HTTPS, and only with a client certificate of the cluster (the admin's, copied out).
            # The host is not checked: the emulated proxy's address is in no certificate (a
            # Prometheus sets tls_config.server_name: godel-service).
            admin_https = tls.https_client_context(tls.files(home / "tls", tls.ADMIN))
            admin_https.check_hostname = False
            anonymous = ssl.create_default_context(cafile=str(home / "tls" / "ca.crt"))
            anonymous.check_hostname = False

            def get(path: str, context: ssl.SSLContext) -> bytes:
                with urllib.request.urlopen(path, timeout=10, context=context) as response:
                    body: bytes = response.read()
                    return body

            dashboard = f"https://{deployment.published[8080]}/api/summary"

            def dashboard_nodes() -> int:
                return int(json.loads(get(dashboard, admin_https))["nodes"]["total"])

            wait_until(lambda: dashboard_nodes() == HOLLOW_NODES + 1, what="the dashboard's nodes")
            metrics = f"https://{deployment.published[9090]}/metrics"
            assert b"godel_dispatcher_shard_credits{" in get(metrics, admin_https)
            for refused in (dashboard, metrics):
                with pytest.raises(OSError):
                    get(refused, anonymous)
        assert not deployment.exited(), deployment.exited()
