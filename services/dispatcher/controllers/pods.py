"""What a submitted job is stored as: the job with its defaults made explicit (``normalise_job``)
and its pods (``pods_for``), as services/README.md specifies them. Built by Submit and by the
chunked creation (``creation.py``); validation (``api/validation.py``) only judges."""

from __future__ import annotations

from placement.quotas import DEFAULT_QUEUE
from protos.godel.v1 import objects_pb2 as pb
from services.dispatcher.objects import PODS_CREATED_ANNOTATION


def pods_for(
    job: pb.Job, preemptible: bool = False, start: int = 0, stop: int | None = None
) -> list[pb.Pod]:
    """The pods of a (valid) job, as services/README.md specifies: `<job>-<index>`, pending, the
    spec copied from the job; those of indexes ``start`` to ``stop`` (default: all), so a big
    job's pods are built a chunk at a time rather than all at once on the event loop.

    ``preemptible``: whether they may be preempted, resolved once at Submit from the job, its
    priority class and its queue (``priorityclasses.pod_preemptible``), so a pod (and the
    replacements copied from it) keeps what it was created with even if the class or the
    queue's default changes later.
    """
    spec = job.spec
    # One prototype copied per pod: a copy of one message is several times cheaper than setting
    # every field again (100,000 pods took seconds of the dispatcher's event loop).
    proto = pb.Pod()
    if spec.template.labels:  # update() is a Python loop even over an empty map
        proto.metadata.labels.update(spec.template.labels)
    proto.metadata.owner = job.metadata.owner  # a tenant's pods are its own, as its job is
    ps = proto.spec
    ps.job = job.metadata.name
    ps.priority = spec.priority
    ps.qos = spec.qos
    ps.preemptible = preemptible
    ps.preemption_policy = spec.preemption_policy
    ps.protection_seconds = spec.protection_seconds
    ps.queue = spec.queue
    ps.template.CopyFrom(spec.template)
    proto.status.phase = pb.POD_PENDING
    indexes = range(start, spec.replicas if stop is None else min(stop, spec.replicas))
    if len(indexes) == 1:  # a one-pod job (most jobs of online traffic): the prototype is it
        proto.metadata.name = f"{job.metadata.name}-{indexes[0]}"
        proto.spec.index = indexes[0]
        return [proto]
    pods = []
    for i in indexes:
        pod = pb.Pod()
        pod.CopyFrom(proto)
        pod.metadata.name = f"{job.metadata.name}-{i}"
        pod.spec.index = i
        pods.append(pod)
    return pods


def normalise_job(job: pb.Job) -> pb.Job:
    """The job as stored: defaults made explicit (queue "default", QoS guaranteed), pending."""
    out = pb.Job()
    out.CopyFrom(job)
    out.metadata.resource_version = 0
    out.metadata.uid = ""
    out.metadata.creation_timestamp_ms = 0
    out.metadata.deletion_timestamp_ms = 0
    # The system's mark, never the user's: a submitted one would hold the job back for good.
    out.metadata.annotations.pop(PODS_CREATED_ANNOTATION, None)
    out.spec.queue = out.spec.queue or DEFAULT_QUEUE
    if out.spec.qos == pb.QOS_UNSPECIFIED:
        out.spec.qos = pb.QOS_GUARANTEED
    out.ClearField("status")
    out.status.phase = pb.JOB_PENDING
    return out
