"""Small builders of stored objects for tests."""

from __future__ import annotations

from protos.godel.v1 import objects_pb2 as pb

GiB = 1 << 30
MiB = 1 << 20


def node(
    name: str,
    *,
    cpu: int = 4000,
    mem: int = 32 * GiB,
    pods: int = 110,
    be_cpu: int = 0,
    be_mem: int = 0,
    gpus: int = 0,
) -> pb.Node:
    n = pb.Node(metadata=pb.ObjectMeta(name=name))
    n.status.allocatable.milli_cpu = cpu
    n.status.allocatable.memory_bytes = mem
    n.status.allocatable.pods = pods
    n.status.allocatable.gpus = gpus
    n.status.reclaimable.milli_cpu = be_cpu
    n.status.reclaimable.memory_bytes = be_mem
    n.status.ready = True
    return n


def job(
    name: str,
    *,
    replicas: int = 1,
    min_member: int = 1,
    cpu: int = 100,
    mem: int = 500 * MiB,
    qos: int = pb.QOS_GUARANTEED,
) -> pb.Job:
    j = pb.Job(metadata=pb.ObjectMeta(name=name))
    j.spec.replicas = replicas
    j.spec.min_member = min_member
    j.spec.qos = qos  # type: ignore[assignment]
    j.spec.template.requests.milli_cpu = cpu
    j.spec.template.requests.memory_bytes = mem
    return j


def pods_of(j: pb.Job) -> list[pb.Pod]:
    out = []
    for i in range(j.spec.replicas):
        p = pb.Pod(metadata=pb.ObjectMeta(name=f"{j.metadata.name}-{i}"))
        p.metadata.labels.update(j.spec.template.labels)  # as the dispatcher's pods_for does
        p.spec.job = j.metadata.name
        p.spec.index = i
        p.spec.qos = j.spec.qos
        p.spec.template.CopyFrom(j.spec.template)
        p.status.phase = pb.POD_PENDING
        out.append(p)
    return out


def with_numa(
    n: pb.Node, *, sockets: int = 2, per_socket: int = 1, gpus_per_numa: int = 0
) -> pb.Node:
    """``n`` reporting ``sockets`` × ``per_socket`` NUMA nodes (ids in order) that split its
    guaranteed cpu and memory evenly, each with ``gpus_per_numa`` GPUs (added to the node)."""
    zones = sockets * per_socket
    topo = n.status.topology
    topo.sockets = sockets
    for i in range(zones):
        z = topo.numa_nodes.add(id=i, socket=i // per_socket)
        z.capacity.milli_cpu = n.status.allocatable.milli_cpu // zones
        z.capacity.memory_bytes = n.status.allocatable.memory_bytes // zones
        z.capacity.gpus = gpus_per_numa
    n.status.allocatable.gpus = gpus_per_numa * zones
    return n


def numa_job(j: pb.Job, policy: int, *, gpus: int = 0) -> pb.Job:
    j.spec.template.numa_policy = policy  # type: ignore[assignment]
    j.spec.template.requests.gpus = gpus
    return j


def job_affinity(j: pb.Job, required: list[str], preferred: list[str] | None = None) -> pb.Job:
    j.spec.job_affinity.required_topology_keys.extend(required)
    j.spec.job_affinity.preferred_topology_keys.extend(preferred or [])
    return j


# A process pod's attack on another tenant's running pod (pid ``$TARGET``) through
# /proc/<pid>/cwd, and on the agent's pod dir (``$AGENT_DIR``) and the other pod's log
# (``$VICTIM_LOG``): it prints its uid, then an ATTACK- line for each attempt that worked, then
# "attack over".
POD_ATTACK = """
id -u
theirs=/proc/$TARGET/cwd
cat $theirs/secret && echo ATTACK-READ
ls $theirs && echo ATTACK-LISTED
echo stolen >> $theirs/secret && echo ATTACK-WROTE
kill -9 $TARGET && echo ATTACK-KILLED
ls $AGENT_DIR && echo ATTACK-LISTED-AGENT-DIR
cat $VICTIM_LOG && echo ATTACK-READ-LOG
echo attack over
"""


def gpu_node(name: str, cards: int, model: str = "V100M32", **kw: int) -> pb.Node:
    """A node with ``cards`` GPU cards of ``model``."""
    n = node(name, gpus=cards, **kw)
    n.status.gpu_model = model
    return n


def gpu_job(j: pb.Job, cards: int = 1, *, milli: int = 0, models: tuple[str, ...] = ()) -> pb.Job:
    """``j`` asking ``cards`` whole GPU cards, or (``milli``) a share of one card, of
    ``models`` (empty: any)."""
    j.spec.template.requests.gpus = cards
    j.spec.template.gpu_milli = milli
    j.spec.template.gpu_models.extend(models)
    return j


def reservation(
    name: str,
    node: str,
    *,
    job: str = "",
    index: int | None = None,
    selector: str = "",
    cpu: int = 1000,
    mem: int = GiB,
    ttl: int = 300,
    tenant: str = "",
    ports: tuple[int, ...] = (),
) -> pb.Reservation:
    """A reservation as the dispatcher stores it: holding its room on ``node`` (``""``: pending
    a placement) for ``job`` (pod ``index`` of it) or the pods ``selector`` picks."""
    r = pb.Reservation(metadata=pb.ObjectMeta(name=name, owner=tenant))
    r.spec.template.requests.milli_cpu = cpu
    r.spec.template.requests.memory_bytes = mem
    for port in ports:
        r.spec.template.ports.add(container_port=port, host_port=port)
    if selector:
        r.spec.owner.selector = selector
    else:
        r.spec.owner.job = job
    if index is not None:
        r.spec.owner.index = index
    r.spec.node = node
    r.spec.ttl_seconds = ttl
    r.status.phase = pb.RESERVATION_RESERVED if node else pb.RESERVATION_PENDING
    r.status.node = node
    return r
