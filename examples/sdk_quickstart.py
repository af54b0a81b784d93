"""The SDK in one page: submit a gang and an online service, wait for them, show where each pod
runs (and why any is pending), clean up.

    godel up                          # or: export GODEL_ADDRESS=host:port of a deployment
    python examples/sdk_quickstart.py

The client finds the cluster by itself: $GODEL_ADDRESS (or $GODEL_SERVER) if set, else the
cluster `godel up` started in $GODEL_HOME.
"""

from __future__ import annotations

import sys

from godel.client import ClientError, GodelClient, Job, job

SERVICE = """
apiVersion: godel/v1
kind: Job
metadata: {name: quickstart-web, labels: {app: quickstart}}
spec:
  replicas: 3
  minMember: 1              # each replica may run alone, like a Deployment
  replaceLostPods: true
  template:
    requests: {cpu: 250m, memory: 256Mi}
"""


def main() -> int:
    with GodelClient() as client:
        print(f"cluster: {client.address}")
        # A gang: all four workers are placed together or none is. Pods of hollow nodes run
        # until deleted (no durationMs), so waiting for Running is the point to stop at.
        gang = job(
            "quickstart-train",
            replicas=4,
            min_member=4,
            cpu="500m",
            memory="512Mi",
            labels={"app": "quickstart"},
        )
        # The same thing written as a manifest, as `godel apply -f` takes it.
        service = Job.from_manifest(SERVICE)
        handles = client.submit([gang, service])
        try:
            for handle in handles:
                try:
                    state = handle.wait("Running", timeout=120)
                    print(f"job/{state.name}: {state.phase}")
                except TimeoutError:
                    print(f"job/{handle.name}: still {handle.status().phase} after 120s")
            for handle in handles:
                for why in handle.explain():
                    where = f"on {why.node}" if why.node else f"pending: {why.summary}"
                    print(f"  pod/{why.pod}  {why.phase:<9} {where}")
        except ClientError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        finally:
            for handle in handles:
                handle.delete()
                print(f"job/{handle.name} deleted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
