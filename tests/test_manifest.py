"""Manifests: friendly quantities and enums parse to exact integers and values; every malformed
manifest gets a one-line error naming the document and the field — labels and selectors held to
Kubernetes' label syntax, bytes that are not UTF-8 text named by the first bad byte."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from godel.manifest import ManifestError, load, load_file, parse_quantity, to_manifest
from protos.godel.v1 import objects_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent

QUANTITIES = [
    # value, cpu?, expected
    ("500m", True, 500),
    ("2", True, 2000),
    (0.5, True, 500),
    (3, True, 3000),
    ("1Gi", False, 1 << 30),
    ("500Mi", False, 500 << 20),
    ("1G", False, 10**9),
    ("1.5Gi", False, 3 << 29),
    (1024, False, 1024),
]


@pytest.mark.parametrize(("value", "cpu", "expected"), QUANTITIES)
def test_quantities(value: object, cpu: bool, expected: int) -> None:
    assert parse_quantity(value, cpu=cpu, field="f") == expected


JOB = """
apiVersion: godel/v1
kind: Job
metadata: {name: train, labels: {team: ml}}
spec:
  replicas: 4
  minMember: 4
  qos: best-effort
  template:
    requests: {cpu: 250m, memory: 1Gi, gpus: 1}
    tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
    affinity:
      nodeAffinity:
        required: [{matchExpressions: [{key: zone, operator: NotIn, values: [a]}]}]
"""


def test_job_manifest_round_trip() -> None:
    [m] = load(JOB, "job.yaml")
    job = m.obj
    assert isinstance(job, pb.Job)
    assert (job.spec.replicas, job.spec.min_member, job.spec.qos) == (4, 4, pb.QOS_BEST_EFFORT)
    req = job.spec.template.requests
    assert (req.milli_cpu, req.memory_bytes, req.gpus) == (250, 1 << 30, 1)
    tol = job.spec.template.tolerations[0]
    assert (tol.operator, tol.effect) == (pb.Toleration.EXISTS, pb.NO_SCHEDULE)
    expr = job.spec.template.affinity.node_affinity.required[0].match_expressions[0]
    assert expr.operator == pb.LabelSelectorRequirement.NOT_IN
    again = load(__import__("yaml").safe_dump(to_manifest("Job", job)), "again.yaml")[0].obj
    assert again == job


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("{replicas: 3}", 3),  # unsaid: a gang of all of them, as the SDK's job() makes it
        ("{replicas: 3, minMember: 1}", 1),
        ("{replicas: 3, min_member: 2}", 2),
        ("{replicas: 3, minMember: 0}", 0),  # said: kept, and refused by the server as 0
    ],
)
def test_job_min_member_defaults_to_replicas(spec: str, expected: int) -> None:
    text = f"apiVersion: godel/v1\nkind: Job\nmetadata: {{name: j}}\nspec: {spec}\n"
    [m] = load(text, "j.yaml")
    assert isinstance(m.obj, pb.Job)
    assert m.obj.spec.min_member == expected


TOPOLOGY_JOB = """
apiVersion: godel/v1
kind: Job
metadata: {name: web}
spec:
  replicas: 3
  template:
    labels: {app: web}
    requests: {cpu: 100m, memory: 64Mi}
    affinity:
      podAntiAffinity:
        required:
          - labelSelector: {matchLabels: {app: web}}
            topologyKey: zone
      podAffinity:
        preferred:
          - weight: 10
            term:
              labelSelector:
                matchExpressions: [{key: tier, operator: Exists}]
              topologyKey: hostname
    topologySpreadConstraints:
      - maxSkew: 1
        topologyKey: zone
        whenUnsatisfiable: DoNotSchedule
        labelSelector: {matchLabels: {app: web}}
      - {maxSkew: 2, topologyKey: hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: []}
"""


def test_topology_manifest_kubernetes_shapes_round_trip() -> None:
    [m] = load(TOPOLOGY_JOB, "web.yaml")
    job = m.obj
    assert isinstance(job, pb.Job)
    t = job.spec.template
    anti = t.affinity.pod_anti_affinity.required[0]
    assert anti.topology_key == "zone"
    assert [(r.key, r.operator, list(r.values)) for r in anti.label_selector] == [
        ("app", pb.LabelSelectorRequirement.IN, ["web"])
    ]
    pref = t.affinity.pod_affinity.preferred[0]
    assert (
        pref.weight == 10
        and pref.term.label_selector[0].operator == pb.LabelSelectorRequirement.EXISTS
    )
    tsc = pb.TopologySpreadConstraint
    hard, soft = t.topology_spread_constraints
    assert (hard.max_skew, hard.topology_key, hard.when_unsatisfiable) == (
        1,
        "zone",
        tsc.DO_NOT_SCHEDULE,
    )
    assert (soft.max_skew, soft.when_unsatisfiable, len(soft.label_selector)) == (
        2,
        tsc.SCHEDULE_ANYWAY,
        0,
    )
    again = load(__import__("yaml").safe_dump(to_manifest("Job", job)), "again.yaml")[0].obj
    assert again == job


def test_label_selector_unknown_field_is_named() -> None:
    text = TOPOLOGY_JOB.replace(
        "{matchLabels: {app: web}}\n            topologyKey",
        "{matchLabel: {app: web}}\n            topologyKey",
    )
    with pytest.raises(ManifestError, match="matchLabel"):
        load(text, "web.yaml")


PREEMPTION_FIELDS = [
    # id, spec text, the field set on the parsed object (a path from the object), expected value
    ("preemptionPolicy Never", "spec: {preemptionPolicy: Never}", "spec.preemption_policy",
     pb.NEVER),
    ("preemptionPolicy PreemptLowerPriority", "spec: {preemptionPolicy: PreemptLowerPriority}",
     "spec.preemption_policy", pb.PREEMPT_LOWER_PRIORITY),
    ("protectionSeconds", "spec: {protectionSeconds: 300}", "spec.protection_seconds", 300),
    ("terminationGraceSeconds", "spec: {template: {terminationGraceSeconds: 10}}",
     "spec.template.termination_grace_seconds", 10),
    ("backoffLimit", "spec: {backoffLimit: 4}", "spec.backoff_limit", 4),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "path", "expected"),
    [c[1:] for c in PREEMPTION_FIELDS],
    ids=[c[0] for c in PREEMPTION_FIELDS],
)
def test_job_preemption_fields_parse(text: str, path: str, expected: int) -> None:
    [m] = load(_doc(text), "job.yaml")
    value: object = m.obj
    for part in path.split("."):
        value = getattr(value, part)
    assert value == expected


PRESENCE = [
    # id, job spec text, field of spec, present?, value
    ("preemptible false is written, not unset", "spec: {preemptible: false}", "preemptible",
     True, False),
    ("preemptible omitted is unset", "spec: {replicas: 1}", "preemptible", False, False),
    ("backoffLimit 0 is written, not unset", "spec: {backoffLimit: 0}", "backoff_limit", True, 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "field", "present", "value"),
    [c[1:] for c in PRESENCE],
    ids=[c[0] for c in PRESENCE],
)
def test_optional_job_fields_keep_presence_through_a_round_trip(
    text: str, field: str, present: bool, value: object
) -> None:
    [m] = load(_doc(text), "job.yaml")
    again = load(__import__("yaml").safe_dump(to_manifest("Job", m.obj)), "again.yaml")[0].obj
    for obj in (m.obj, again):
        assert isinstance(obj, pb.Job)
        assert obj.spec.HasField(field) == present
        assert getattr(obj.spec, field) == value


def test_queue_preemptible_default_parses() -> None:
    [m] = load(_doc("spec: {preemptibleDefault: true}", kind="Queue"), "queue.yaml")
    assert isinstance(m.obj, pb.Queue) and m.obj.spec.preemptible_default


def test_queue_min_max_weight_and_limits_round_trip() -> None:
    spec = (
        "spec: {min: {cpu: '2', memory: 1Gi}, quota: {cpu: '4'}, weight: 3, "
        "maxPodsPerJob: 10, maxPendingPods: 50}"
    )
    [m] = load(_doc(spec, kind="Queue"), "queue.yaml")
    assert isinstance(m.obj, pb.Queue)
    got = m.obj.spec
    assert (got.min.milli_cpu, got.min.memory_bytes, got.quota.milli_cpu) == (2000, 1 << 30, 4000)
    assert (got.weight, got.max_pods_per_job, got.max_pending_pods) == (3, 10, 50)
    [again] = load(yaml.safe_dump(to_manifest("Queue", m.obj)), "again.yaml")
    assert again.obj == m.obj


# (id, spec as written, (min_available, max_unavailable) with None for unset)
BUDGETS = [
    ("maxUnavailable 0 means never disrupt", "{job: web, maxUnavailable: 0}", (None, 0)),
    ("minAvailable 0 is a value", "{job: web, minAvailable: 0}", (0, None)),
    ("snake_case spelling", "{job: web, min_available: 2}", (2, None)),
    (
        "selector budget",
        "{selector: [{key: app, operator: In, values: [web]}], maxUnavailable: 1}",
        (None, 1),
    ),
]


@pytest.mark.parametrize(("spec", "limits"), [b[1:] for b in BUDGETS], ids=[b[0] for b in BUDGETS])
def test_budget_manifest_round_trip(spec: str, limits: tuple[int | None, int | None]) -> None:
    [m] = load(
        f"apiVersion: godel/v1\nkind: DisruptionBudget\nmetadata: {{name: web}}\nspec: {spec}"
    )
    budget = m.obj
    assert isinstance(budget, pb.DisruptionBudget)

    def presence(b: pb.DisruptionBudget) -> tuple[int | None, int | None]:
        s = b.spec
        return (
            s.min_available if s.HasField("min_available") else None,
            s.max_unavailable if s.HasField("max_unavailable") else None,
        )

    assert presence(budget) == limits
    # What `get -o yaml` prints (status included, as the store returns it) reads back the same.
    budget.status.current_healthy = 3
    printed = to_manifest("DisruptionBudget", budget)
    assert printed["status"] == {
        "currentHealthy": 3,
        "desiredHealthy": 0,
        "disruptionsAllowed": 0,
        "expectedPods": 0,
    }
    [again] = load(yaml.safe_dump(printed), "again.yaml")
    assert isinstance(again.obj, pb.DisruptionBudget)
    assert presence(again.obj) == limits
    budget.ClearField("status")
    assert again.obj == budget


def _doc(body: str, kind: str = "Job") -> str:
    return f"apiVersion: godel/v1\nkind: {kind}\nmetadata: {{name: a}}\n{body}"


def _labelled(labels: str, kind: str = "Job") -> str:
    return f"apiVersion: godel/v1\nkind: {kind}\nmetadata: {{name: a, labels: {labels}}}\n"


MALFORMED = [
    # name, text, error text that must appear
    ("not yaml", "[1, 2", "not valid YAML"),
    ("empty file", "", "holds no manifest"),
    ("not a mapping", "- 1\n- 2", "must be a mapping"),
    ("wrong apiVersion", "apiVersion: v1\nkind: Job\nmetadata: {name: a}", "apiVersion"),
    ("unknown kind", _doc("", kind="Widget"), "kind: 'Widget' is not one of"),
    ("system kind", _doc("", kind="Pod"), "kind: 'Pod' is not one of"),
    ("missing name", "apiVersion: godel/v1\nkind: Job\nmetadata: {}", "metadata.name"),
    ("unknown field", _doc("spec: {replicaz: 3}"), "spec.replicaz: unknown field"),
    ("string for integer", _doc("spec: {replicas: many}"), "spec.replicas: expected an integer"),
    (
        "bad quantity",
        _doc("spec: {template: {requests: {cpu: lots}}}"),
        "spec.template.requests.cpu",
    ),
    ("bad cpu unit", _doc("spec: {template: {requests: {cpu: 1Gi}}}"), "unknown cpu unit"),
    (
        "negative quantity",
        _doc("spec: {template: {requests: {memory: -1}}}"),
        "spec.template.requests.memory",
    ),
    (
        "finer than a unit",
        _doc("spec: {template: {requests: {cpu: 0.0001}}}"),
        "finer than the smallest unit",
    ),
    ("bad enum", _doc("spec: {qos: turbo}"), "spec.qos: 'turbo' is not one of"),
    ("misspelt status field", _doc("status: {boundd: 1}"), "status.boundd: unknown field"),
    ("List without items", "apiVersion: godel/v1\nkind: List\n", "[0] items: a List needs"),
    (
        "list expected",
        _doc("spec: {template: {tolerations: {key: a}}}"),
        "spec.template.tolerations: expected a list",
    ),
    ("unknown top-level", _doc("extra: 1"), "unknown top-level field(s) extra"),
    (
        "infinite quantity",
        _doc("spec: {template: {requests: {cpu: .inf}}}"),
        "spec.template.requests.cpu: inf is not a finite quantity",
    ),
    (
        "quantity beyond int64",
        _doc("spec: {template: {requests: {memory: 99999999999999999999Gi}}}"),
        "spec.template.requests.memory: '99999999999999999999Gi' is too large",
    ),
    ("nested too deeply", "[" * 5000 + "]" * 5000, "nested too deeply to be a manifest"),
    ("YAML error on one line", "a:\n  - b\n c: d",
     "not valid YAML: while parsing a block mapping: expected <block end>, but found "
     "'<block mapping start>' (line 3, column 2)"),
    ("a control character", "apiVersion: godel/v1\nkind: Job\nmetadata: {name: a\x00}",
     "not text (control character #x00 at line 3, column 19)"),
    # Label syntax (placement.labels), named by the manifest's own field.
    ("label key with spaces", _labelled("{'has spaces!': x}"),
     "metadata.labels['has spaces!']: 'has spaces!' is not a valid label key"),
    ("label value of 70 characters", _labelled("{team: " + "v" * 70 + "}"),
     "metadata.labels['team']: a label value must be at most 63 characters (got 70)"),
    ("label key a/b/c", _labelled("{a/b/c: x}"),
     "metadata.labels['a/b/c']: 'a/b/c': prefix 'a/b' is not a DNS-1123 subdomain"),
    ("empty label key", _labelled("{'': x}"), "metadata.labels['']: a label key must not be empty"),
    ("pod label value", _doc("spec: {template: {labels: {app: 'x y'}}}"),
     "spec.template.labels['app']: 'x y' is not a valid label value"),
    ("node selector value", _doc("spec: {template: {nodeSelector: {zone: -a}}}"),
     "spec.template.nodeSelector['zone']: '-a' is not a valid label value"),
    ("matchLabels key", _doc("spec: {template: {affinity: {podAffinity: {required: "
                             "[{topologyKey: zone, labelSelector: {matchLabels: {'x y': a}}}]}}}}"),
     "spec.template.affinity.podAffinity.required[0].labelSelector.matchLabels['x y']: "
     "'x y' is not a valid label key"),
    ("In value", _doc("spec: {template: {affinity: {nodeAffinity: {required: [{matchExpressions: "
                      "[{key: zone, operator: In, values: [a, 'b c']}]}]}}}}"),
     "nodeAffinity.required[0].matchExpressions[0].values[1]: 'b c' is not a valid label value"),
    ("selector key", _doc("spec: {template: {affinity: {nodeAffinity: {required: [{matchExpressions: "
                          "[{key: '-zone', operator: Exists}]}]}}}}"),
     "matchExpressions[0].key: '-zone' is not a valid label key"),
    ("topology key", _doc("spec: {jobAffinity: {requiredTopologyKeys: [rack, 'Bad Key']}}"),
     "spec.jobAffinity.requiredTopologyKeys[1]: 'Bad Key' is not a valid label key"),
    ("toleration value", _doc("spec: {template: {tolerations: [{key: gpu, operator: Equal, "
                              "value: 'a b'}]}}"),
     "spec.template.tolerations[0].value: 'a b' is not a valid label value"),
    ("node label", "apiVersion: godel/v1\nkind: Node\nmetadata: {name: n, labels: {zone: 'a!'}}",
     "metadata.labels['zone']: 'a!' is not a valid label value"),
    ("taint key", _doc("spec: {taints: [{key: 'x y', effect: NoSchedule}]}", kind="Node"),
     "spec.taints[0].key: 'x y' is not a valid label key"),
    ("queue label", _labelled("{'q q': x}", kind="Queue"), "metadata.labels['q q']"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "text", "needle"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_manifests_name_the_problem(name: str, text: str, needle: str) -> None:
    with pytest.raises(ManifestError) as err:
        load(text, "bad.yaml")
    assert needle in str(err.value)
    assert str(err.value).startswith("bad.yaml")
    assert "\n" not in str(err.value), "one line"


def test_valid_labels_and_selector_values_pass() -> None:
    """What the label syntax allows reads, including a Gt/Lt value (an integer, not a label
    value) and labels written as numbers."""
    [m] = load(
        _labelled("{godel.io/team: ml, gpu: 1, empty: ''}")
        + "spec: {template: {affinity: {nodeAffinity: {required: [{matchExpressions: "
        "[{key: cores, operator: Gt, values: ['-3']}]}]}}}}",
        "ok.yaml",
    )
    assert dict(m.obj.metadata.labels) == {"godel.io/team": "ml", "gpu": "1", "empty": ""}


NOT_TEXT = [
    # (case, bytes, the one-line error after the file's name)
    ("a byte that is not UTF-8", b"apiVersion: godel/v1\nkind: Job\nmetadata: {name: x\xff}\n",
     "job.yaml: not UTF-8 text (byte 0xff at offset 49, line 3)"),
    ("binary", bytes(range(256)), "job.yaml: not UTF-8 text (byte 0x80 at offset 128, line 2)"),
    ("UTF-16", "kind: Job\n".encode("utf-16"), "job.yaml: not UTF-8 text (byte 0xff at offset 0, line 1)"),
    ("NUL bytes", b"\x00" * 16, "job.yaml: not text (control character #x00 at line 1, column 1)"),
]  # fmt: skip


@pytest.mark.parametrize(("data", "error"), [c[1:] for c in NOT_TEXT], ids=[c[0] for c in NOT_TEXT])
def test_bytes_that_are_not_text_are_one_line_naming_the_file(
    data: bytes, error: str, tmp_path: Path
) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(data)
    for read in (lambda: load(data, "job.yaml"), lambda: load_file(path)):
        with pytest.raises(ManifestError) as err:
            read()
        assert str(err.value).replace(str(path), "job.yaml") == error


def test_utf8_bytes_and_a_missing_file() -> None:
    text = "apiVersion: godel/v1\nkind: Job\nmetadata: {name: a, annotations: {note: café}}\n"
    [m] = load(("\ufeff" + text).encode(), "job.yaml")  # a byte-order mark is allowed
    assert m.obj.metadata.annotations["note"] == "café"
    with pytest.raises(ManifestError, match=r"^/nonexistent/job.yaml: cannot read: No such file"):
        load_file("/nonexistent/job.yaml")


def test_examples_parse() -> None:
    # A service's config file (examples/dispatcher-config.yaml) is not a manifest.
    files = sorted(p for p in (ROOT / "examples").glob("*.yaml") if not p.stem.endswith("-config"))
    assert files, "examples/ holds manifests"
    for path in files:
        assert load(path.read_text(), path.name)


JOB_AFFINITY_NUMA_JOB = """
apiVersion: godel/v1
kind: Job
metadata: {name: allreduce}
spec:
  replicas: 2
  minMember: 2
  jobAffinity: {requiredTopologyKeys: [rack], preferredTopologyKeys: [switch]}
  template: {requests: {cpu: "1", memory: 1Gi, gpus: 4}, numaPolicy: Exclusive}
"""


def test_job_affinity_and_numa_policy_manifest_round_trip() -> None:
    [m] = load(JOB_AFFINITY_NUMA_JOB, "allreduce.yaml")
    job = m.obj
    assert isinstance(job, pb.Job)
    a = job.spec.job_affinity
    assert (list(a.required_topology_keys), list(a.preferred_topology_keys)) == (
        ["rack"],
        ["switch"],
    )
    assert job.spec.template.numa_policy == pb.NUMA_POLICY_EXCLUSIVE
    again = load(__import__("yaml").safe_dump(to_manifest("Job", job)), "again.yaml")[0].obj
    assert again == job


KUBERNETES_PRIORITY_CLASS = """
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: high-priority}
value: 1000000
globalDefault: false
description: "For the XYZ service's pods only."
preemptionPolicy: Never
preemptible: false
"""


def test_a_priority_class_as_kubernetes_writes_it_round_trips() -> None:
    [m] = load(KUBERNETES_PRIORITY_CLASS, "pc.yaml")
    assert m.kind == "PriorityClass" and isinstance(m.obj, pb.PriorityClass)
    got = m.obj
    assert (got.metadata.name, got.value, got.global_default) == ("high-priority", 1000000, False)
    assert got.description == "For the XYZ service's pods only."
    assert got.preemption_policy == pb.NEVER
    assert got.HasField("preemptible") and got.preemptible is False
    printed = to_manifest("PriorityClass", got)
    assert printed == {
        "apiVersion": "godel/v1",
        "kind": "PriorityClass",
        "metadata": {"name": "high-priority"},
        "value": 1000000,
        "description": "For the XYZ service's pods only.",
        "preemptionPolicy": "Never",
        "preemptible": False,
    }
    [again] = load(yaml.safe_dump(printed), "again.yaml")
    assert again.obj == got


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("apiVersion: godel/v1\nkind: PriorityClass\nmetadata: {name: x}\nspec: {value: 1}\n",
         "pc.yaml[0]: unknown top-level field(s) spec"),
        ("apiVersion: godel/v1\nkind: PriorityClass\nmetadata: {name: x}\nvalue: high\n",
         "pc.yaml[0] value: expected an integer, got 'high'"),
        ("apiVersion: godel/v1\nkind: PriorityClass\nmetadata: {name: x}\npreemptionPolicy: Sometimes\n",
         "pc.yaml[0] preemptionPolicy: 'Sometimes' is not one of PREEMPT_LOWER_PRIORITY, NEVER"),
        ("apiVersion: scheduling.k8s.io/v1\nkind: Queue\nmetadata: {name: x}\n",
         "pc.yaml[0] apiVersion: must be 'godel/v1', got 'scheduling.k8s.io/v1'"),
    ],
)  # fmt: skip
def test_malformed_priority_classes_name_the_field(text: str, needle: str) -> None:
    with pytest.raises(ManifestError) as exc:
        load(text, "pc.yaml")
    assert str(exc.value) == needle
