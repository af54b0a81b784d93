"""Manifests: Kubernetes-style YAML documents to and from the API's protobuf objects.

    apiVersion: godel/v1
    kind: Job                       # Job | Node | Queue | DisruptionBudget | PriorityClass | Reservation (or a List)
    metadata: {name: train, labels: {team: ml}}
    spec:
      replicas: 8
      minMember: 8                  # snake_case or camelCase names; default: replicas (a gang)
      qos: best-effort              # enum values in any case, with or without their prefix
      preemptionPolicy: Never       # or PreemptLowerPriority (the default)
      protectionSeconds: 600        # not a preemption victim until 10 minutes after it started
      template:
        requests: {cpu: 500m, memory: 1Gi, gpu: 1}    # quantities as Kubernetes writes them
        gpuMilli: 300               # a share of one card (1..999, with gpu: 1); unset: whole cards
        gpuModels: [V100M16, V100M32]                 # the card models it accepts; unset: any

GPU cards: ``gpu`` (or ``gpus``, ``nvidia.com/gpu``) in ``requests`` counts whole cards;
``gpuMilli`` and ``gpuModels`` sit in the template beside ``requests`` (they are not quantities
that add up: a share is of one card), and ``get -o yaml`` writes them back there. ``gpuMilli``
inside ``requests`` is refused, pointing there (it would otherwise be an extended resource).

A PriorityClass is written as Kubernetes writes it, its fields beside ``metadata`` (``value``,
``globalDefault``, ``description``, ``preemptionPolicy``, and our ``preemptible``); the other kinds
have ``spec`` (and ``status``). A PriorityClass copied from Kubernetes, ``apiVersion:
scheduling.k8s.io/v1``, is read as it is.

Fields with presence keep an explicit 0: a DisruptionBudget's ``maxUnavailable: 0`` ("never
disrupt") and ``minAvailable: 0`` are values, written back by ``get -o yaml``.

``to_manifest`` prints stored objects in the same format (camelCase, quantities, enum values as
words), and ``load`` reads that back to the same object: ``godel get job x -o yaml | godel apply
-f -`` changes nothing. The system's ``status`` is read and ignored (a Node declares its
capacities there).

Every error is one line naming the document and the field (``job.yaml[0]
spec.template.requests.cpu: ...``); labels, node selectors, selector keys and values, topology
keys, taints and tolerations are held to Kubernetes' label syntax as they are read
(``placement.labels``, the rules the dispatcher applies again). ``load`` takes bytes too
(``load_file`` reads a file): what is not UTF-8 text is named by its first bad byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import Message

from placement import labels as labels_syntax
from protos.godel.v1 import api_pb2
from protos.godel.v1 import objects_pb2 as pb
from store import kinds
from store.kinds import StoredObject

API_VERSION = "godel/v1"
# Kinds whose Kubernetes manifests are read as they are, their Kubernetes apiVersion included
# (printed back as API_VERSION).
KUBERNETES_API_VERSIONS = {"PriorityClass": "scheduling.k8s.io/v1"}

_BINARY = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50}
_DECIMAL = {"k": 10**3, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)$")
# Friendly resource names -> Resources fields.
_RESOURCE_ALIASES = {
    "cpu": "milli_cpu",
    "memory": "memory_bytes",
    "mem": "memory_bytes",
    "gpu": "gpus",
    "gpus": "gpus",
    "nvidia.com/gpu": "gpus",
    "pods": "pods",
}


# Fields with a label's syntax (``placement.labels``, the rules the dispatcher holds every request
# to), checked as a manifest is read so the error names the manifest's own field: maps of labels
# (key and value), label keys, label values. A selector requirement's values are labels' values
# for In and NotIn (``_check_requirement``).
_LABEL_MAPS = frozenset(
    {
        pb.ObjectMeta.DESCRIPTOR.fields_by_name["labels"].full_name,
        pb.PodTemplate.DESCRIPTOR.fields_by_name["labels"].full_name,
        pb.PodTemplate.DESCRIPTOR.fields_by_name["node_selector"].full_name,
    }
)
_LABEL_KEYS = frozenset(
    {
        pb.LabelSelectorRequirement.DESCRIPTOR.fields_by_name["key"].full_name,
        pb.PodAffinityTerm.DESCRIPTOR.fields_by_name["topology_key"].full_name,
        pb.TopologySpreadConstraint.DESCRIPTOR.fields_by_name["topology_key"].full_name,
        pb.JobAffinity.DESCRIPTOR.fields_by_name["required_topology_keys"].full_name,
        pb.JobAffinity.DESCRIPTOR.fields_by_name["preferred_topology_keys"].full_name,
        pb.Taint.DESCRIPTOR.fields_by_name["key"].full_name,
        pb.Toleration.DESCRIPTOR.fields_by_name["key"].full_name,
    }
)
_LABEL_VALUES = frozenset(
    {
        pb.Taint.DESCRIPTOR.fields_by_name["value"].full_name,
        pb.Toleration.DESCRIPTOR.fields_by_name["value"].full_name,
    }
)
_VALUED_OPERATORS = frozenset({pb.LabelSelectorRequirement.IN, pb.LabelSelectorRequirement.NOT_IN})
# GPU model names are strings as written (a YAML ``true`` or ``3090`` is not taken for one).
_GPU_MODELS = pb.PodTemplate.DESCRIPTOR.fields_by_name["gpu_models"].full_name
# What a share of a card is called where a user may look for it among the quantities.
_GPU_SHARE_KEYS = frozenset({"gpumilli", "gpu_milli", "gpu-milli"})
_GPU_SHARE_HINT = "a share of one card is gpu: 1 in requests and gpuMilli: 1..999 beside requests"


class ManifestError(ValueError):
    def __init__(self, message: str, field: str = "", source: str = "") -> None:
        where = " ".join(part for part in (source, field) if part)
        super().__init__(f"{where}: {message}" if where else message)
        self.reason = message
        self.field = field
        self.source = source


@dataclass(frozen=True, slots=True)
class Manifest:
    kind: str
    obj: StoredObject
    source: str

    @property
    def name(self) -> str:
        return self.obj.metadata.name

    def as_object(self) -> api_pb2.Object:
        return kinds.wrap(self.kind, self.obj)


# Quantities are stored as int64.
_MAX_QUANTITY = (1 << 63) - 1


def parse_quantity(value: Any, *, cpu: bool, field: str) -> int:
    """``500m`` / ``0.5`` / ``2`` cpu -> milli-CPU; ``1Gi`` / ``500M`` / ``1024`` -> bytes."""
    if isinstance(value, bool):
        raise ManifestError(f"expected a quantity, got {value!r}", field)
    if isinstance(value, int):
        amount, suffix = Decimal(value), ""
    elif isinstance(value, float):
        amount, suffix = Decimal(str(value)), ""
    elif isinstance(value, str) and (m := _QUANTITY.match(value.strip())):
        amount, suffix = Decimal(m.group(1)), m.group(2)
    else:
        raise ManifestError(
            f"{value!r} is not a quantity (e.g. {'500m or 2' if cpu else '512Mi or 1Gi'})", field
        )
    try:
        if cpu:
            if suffix == "m":
                result = amount
            elif suffix == "":
                result = amount * 1000
            else:
                raise ManifestError(f"unknown cpu unit {suffix!r} (use m or none)", field)
        elif suffix in _BINARY:
            result = amount * _BINARY[suffix]
        elif suffix in _DECIMAL:
            result = amount * _DECIMAL[suffix]
        elif suffix == "":
            result = amount
        else:
            raise ManifestError(f"unknown unit {suffix!r} (use Ki, Mi, Gi, k, M, G)", field)
    except InvalidOperation as exc:
        raise ManifestError(f"{value!r} is not a quantity", field) from exc
    if not result.is_finite():
        raise ManifestError(f"{value!r} is not a finite quantity", field)
    if result > _MAX_QUANTITY:
        raise ManifestError(f"{value!r} is too large (at most {_MAX_QUANTITY} units)", field)
    if result != result.to_integral_value():
        raise ManifestError(f"{value!r} is finer than the smallest unit", field)
    return int(result)


def _camel_to_snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _enum_value(enum: EnumDescriptor, value: Any, field: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value in enum.values_by_number:
            return value
    elif isinstance(value, str):
        # "NoSchedule", "no-schedule", "NO_SCHEDULE" and "QOS_BEST_EFFORT" all name one value.
        spelled = value if value.isupper() else _camel_to_snake(value.replace("-", "_"))
        wanted = re.sub(r"[^A-Z0-9]", "_", spelled.upper())
        wanted = re.sub(r"_+", "_", wanted)
        for v in enum.values:
            if v.number == 0:
                continue
            if v.name == wanted or v.name.endswith("_" + wanted):
                return int(v.number)
        # A word spelled otherwise than its value splits (``PreScheduling``: JOB_PRESCHEDULING).
        squashed = wanted.replace("_", "")
        prefix = _enum_prefix(enum)
        for v in enum.values:
            if v.number and v.name.removeprefix(prefix).replace("_", "") == squashed:
                return int(v.number)
    choices = ", ".join(v.name for v in enum.values if v.number != 0)
    raise ManifestError(f"{value!r} is not one of {choices}", field)


def _normalise(descriptor: Descriptor, data: Any, path: str) -> dict[str, Any]:
    """Rewrite friendly values (quantities, enum spellings, camelCase keys) into what
    json_format accepts, checking field names as it goes."""
    if not isinstance(data, dict):
        raise ManifestError(f"expected a mapping, got {type(data).__name__}", path)
    if descriptor.full_name == pb.Resources.DESCRIPTOR.full_name:
        return _normalise_resources(data, path)
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ManifestError(f"field names must be strings, got {key!r}", path)
        fd = descriptor.fields_by_name.get(key) or descriptor.fields_by_name.get(
            _camel_to_snake(key)
        )
        here = f"{path}.{key}" if path else key
        if fd is None:
            known = ", ".join(f.name for f in descriptor.fields)
            raise ManifestError(f"unknown field (known: {known})", here)
        out[fd.name] = _normalise_value(fd, value, here)
    if descriptor.full_name == pb.LabelSelectorRequirement.DESCRIPTOR.full_name:
        _check_requirement(out, path)
    return out


def _check_requirement(normalised: dict[str, Any], path: str) -> None:
    """An In or NotIn requirement's values are label values (Gt and Lt take integers)."""
    if normalised.get("operator") not in _VALUED_OPERATORS:
        return
    for i, value in enumerate(normalised.get("values") or []):
        _check_label(labels_syntax.value_problem(value), f"{path}.values[{i}]")


def _check_label(problem: str | None, path: str) -> None:
    if problem is not None:
        raise ManifestError(problem, path)


def _label_selector(value: dict[str, Any], path: str) -> list[Any]:
    """Kubernetes' LabelSelector, ``{matchLabels: {k: v}, matchExpressions: [...]}``, as the
    list of requirements the protos hold (each matchLabels pair an ``In`` of one value)."""
    unknown = set(value) - {"matchLabels", "match_labels", "matchExpressions", "match_expressions"}
    if unknown:
        raise ManifestError(
            f"unknown field {sorted(unknown)[0]!r} (known: matchLabels, matchExpressions)", path
        )
    labels = value.get("matchLabels", value.get("match_labels")) or {}
    if not isinstance(labels, dict):
        raise ManifestError("expected a mapping", f"{path}.matchLabels")
    exprs = value.get("matchExpressions", value.get("match_expressions")) or []
    if not isinstance(exprs, list):
        raise ManifestError(
            f"expected a list, got {type(exprs).__name__}", f"{path}.matchExpressions"
        )
    for k, v in labels.items():
        here = f"{path}.matchLabels[{str(k)!r}]"
        _check_label(labels_syntax.key_problem(str(k)), here)
        if isinstance(v, str | int | float | bool):
            _check_label(labels_syntax.value_problem(str(v)), here)
    out: list[Any] = [
        {"key": str(k), "operator": "In", "values": [v]} for k, v in sorted(labels.items())
    ]
    return out + exprs


def _normalise_value(fd: FieldDescriptor, value: Any, path: str) -> Any:
    if value is None:
        return None
    if fd.name == "label_selector" and isinstance(value, dict):
        value = _label_selector(value, path)
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        if not isinstance(value, dict):
            raise ManifestError("expected a mapping", path)
        value_fd = fd.message_type.fields_by_name["value"]
        if fd.full_name in _LABEL_MAPS:
            return _normalise_labels(value_fd, value, path)
        return {str(k): _normalise_value(value_fd, v, f"{path}.{k}") for k, v in value.items()}
    if fd.is_repeated:
        if not isinstance(value, list):
            raise ManifestError(f"expected a list, got {type(value).__name__}", path)
        return [_normalise_single(fd, v, f"{path}[{i}]") for i, v in enumerate(value)]
    return _normalise_single(fd, value, path)


def _normalise_labels(value_fd: FieldDescriptor, value: dict[Any, Any], path: str) -> Any:
    """A map of labels, each key and value checked (``metadata.labels['team']``)."""
    out: dict[str, Any] = {}
    for k, v in value.items():
        key = str(k)
        here = f"{path}[{key!r}]"
        _check_label(labels_syntax.key_problem(key), here)
        out[key] = _normalise_value(value_fd, v, here)
        if isinstance(out[key], str):  # else json_format names what it is instead
            _check_label(labels_syntax.value_problem(out[key]), here)
    return out


def _normalise_single(fd: FieldDescriptor, value: Any, path: str) -> Any:
    if fd.message_type is not None:
        return _normalise(fd.message_type, value, path)
    if fd.enum_type is not None:
        return _enum_value(fd.enum_type, value, path)
    if fd.type == FieldDescriptor.TYPE_STRING:
        if fd.full_name == _GPU_MODELS and not isinstance(value, str):
            raise ManifestError(
                f"expected a GPU model name as a string (e.g. V100M32), got {value!r}", path
            )
        if isinstance(value, int | float | bool):
            return str(value)  # label values like `gpu: 1` are strings
        if not isinstance(value, str):
            raise ManifestError(f"expected a string, got {type(value).__name__}", path)
        if fd.full_name in _LABEL_KEYS and value:  # an empty one the dispatcher says is required
            _check_label(labels_syntax.key_problem(value), path)
        elif fd.full_name in _LABEL_VALUES:
            _check_label(labels_syntax.value_problem(value), path)
    elif fd.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise ManifestError(f"expected true or false, got {value!r}", path)
    elif not isinstance(value, int) or isinstance(value, bool):
        raise ManifestError(f"expected an integer, got {value!r}", path)
    return value


def _normalise_resources(data: dict[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    extended: dict[str, int] = {}
    for key, value in data.items():
        here = f"{path}.{key}"
        if key.lower() in _GPU_SHARE_KEYS:
            raise ManifestError(f"not a quantity: {_GPU_SHARE_HINT} (template.gpuMilli)", here)
        target = _RESOURCE_ALIASES.get(
            key, key if key in pb.Resources.DESCRIPTOR.fields_by_name else ""
        )
        if target in ("milli_cpu", "memory_bytes"):
            cpu = target == "milli_cpu"
            # `milli_cpu: 500` and `memory_bytes: "1024"` (JSON's int64) are in the base unit.
            if key == target and (isinstance(value, int) or str(value).lstrip("-").isdigit()):
                out[target] = int(value)
            else:
                out[target] = parse_quantity(value, cpu=cpu, field=here)
        elif target == "gpus":
            try:
                out[target] = parse_quantity(value, cpu=False, field=here)
            except ManifestError:
                raise ManifestError(
                    f"{value!r} is not a count of whole cards; {_GPU_SHARE_HINT}", here
                ) from None
        elif target == "pods":
            out[target] = parse_quantity(value, cpu=False, field=here)
        elif target == "extended" or key == "extended":
            if not isinstance(value, dict):
                raise ManifestError("expected a mapping", here)
            for name, amount in value.items():
                extended[str(name)] = parse_quantity(amount, cpu=False, field=f"{here}.{name}")
        else:
            extended[key] = parse_quantity(value, cpu=False, field=here)
    if extended:
        out["extended"] = extended
    for k, v in out.items():
        if k != "extended" and v < 0:
            raise ManifestError(f"must not be negative (got {v})", f"{path}.{k}")
    return out


def parse_document(doc: Any, source: str) -> Manifest:
    if not isinstance(doc, dict):
        raise ManifestError(
            "a manifest must be a mapping with apiVersion, kind, metadata, spec", source=source
        )
    api_version = doc.get("apiVersion")
    kind = doc.get("kind")
    if api_version != API_VERSION and api_version != KUBERNETES_API_VERSIONS.get(str(kind)):
        raise ManifestError(f"must be {API_VERSION!r}, got {api_version!r}", "apiVersion", source)
    if kind not in kinds.USER_KINDS:
        raise ManifestError(f"{kind!r} is not one of {', '.join(kinds.USER_KINDS)}", "kind", source)
    cls = kinds.kind_named(kind).message
    # metadata, spec and status; a PriorityClass's own fields (it has no spec).
    fields = {name for f in cls.DESCRIPTOR.fields for name in (f.name, f.json_name)}
    unknown = sorted(set(doc) - {"apiVersion", "kind"} - fields)
    if unknown:
        raise ManifestError(f"unknown top-level field(s) {', '.join(unknown)}", source=source)
    metadata = doc.get("metadata")
    if not isinstance(metadata, dict) or not metadata.get("name"):
        raise ManifestError("is required", "metadata.name", source)
    body = {k: v for k, v in doc.items() if k in fields and v is not None}
    from google.protobuf import json_format  # only what applies manifests pays for it

    try:
        normalised = _normalise(cls.DESCRIPTOR, body, "")
        obj = json_format.ParseDict(normalised, cls(), ignore_unknown_fields=False)
    except ManifestError as exc:
        raise ManifestError(exc.reason, exc.field, source) from None
    except json_format.ParseError as exc:
        raise ManifestError(str(exc), source=source) from None
    if isinstance(obj, pb.Job) and not _has_key(body.get("spec"), "minMember", "min_member"):
        # Unsaid, a job's pods go together (a gang of all of them), as the SDK's job() makes
        # it: the API cannot tell an unset min_member from 0, a manifest can.
        obj.spec.min_member = obj.spec.replicas
    if isinstance(obj, pb.Job | pb.Queue | pb.DisruptionBudget | pb.Reservation):  # not Node
        # What `godel get -o yaml` printed of the system's status is checked (a misspelt field
        # is still an error) and dropped, as kubectl apply ignores it: only a node's capacities
        # are declared in its status.
        obj.ClearField("status")
    return Manifest(kind, obj, source)


def _has_key(section: Any, *names: str) -> bool:
    return isinstance(section, dict) and any(name in section for name in names)


def _documents(docs: list[Any], source: str) -> Iterable[tuple[Any, str]]:
    """Each manifest of a text's documents, a ``kind: List``'s items in their place."""
    for i, doc in enumerate(docs):
        here = f"{source}[{i}]"
        if isinstance(doc, dict) and doc.get("kind") == "List":
            items = doc.get("items")
            if not isinstance(items, list):
                raise ManifestError("a List needs a list of items", "items", here)
            yield from ((item, f"{here}.items[{j}]") for j, item in enumerate(items))
        else:
            yield doc, here


def load(text: str | bytes, source: str = "<stdin>") -> list[Manifest]:
    """Every document of a (multi-document) YAML text; bytes must be UTF-8. Whatever is wrong —
    bytes that are not text, YAML that does not parse, a field that does not fit — is one
    ManifestError of one line, naming ``source``."""
    import yaml  # imported here, as in dump_yaml: a table-printing `godel get` needs no YAML

    if isinstance(text, bytes):
        text = _decode(text, source)
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
        if not docs:
            raise ManifestError("holds no manifest", source=source)
        return [parse_document(d, where) for d, where in _documents(docs, source)]
    except yaml.reader.ReaderError as exc:
        # A character YAML refuses (NUL, other control characters): a binary file, mostly.
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise ManifestError(
            f"not text (control character #x{exc.character:02x} at line {line}, column {column})",
            source=source,
        ) from None
    except yaml.YAMLError as exc:
        raise ManifestError(f"not valid YAML: {_yaml_problem(exc)}", source=source) from None
    except RecursionError:
        # A manifest is a few levels deep; thousands of nested brackets are garbage.
        raise ManifestError("nested too deeply to be a manifest", source=source) from None


def load_file(path: str | Path) -> list[Manifest]:
    """Every manifest of a file (as ``load``), the errors naming the file; a file that cannot be
    read is a ManifestError too."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ManifestError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    return load(data, str(path))


def _decode(data: bytes, source: str) -> str:
    """UTF-8 bytes as text; anything else is a ManifestError naming the first offending byte
    (a binary file, or text in another encoding)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ManifestError(
            f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}, line {line})",
            source=source,
        ) from None


def _yaml_problem(exc: Exception) -> str:
    """A YAML error on one line: what it was parsing, the problem, and where (PyYAML's own text
    spans several lines and quotes the input)."""
    import yaml

    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())
    parts = [p for p in (exc.context, exc.problem) if p]
    mark = exc.problem_mark or exc.context_mark
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return ": ".join(parts) + where if parts else " ".join(str(exc).split())


# Enum value names kept in capitals when printed (``SORT_FIFO`` prints ``FIFO``, not ``Fifo``).
_ACRONYMS = frozenset({"FIFO", "DRF", "GPU", "NUMA", "CPU"})
# Values written as the original Gödel writes them, not as their names split into words.
_WORDS = {"PRESCHEDULING": "PreScheduling"}
# Status messages whose zero counts are printed: "0 disruptions allowed" is what a budget's reader
# looks for.
_PRINT_ZEROS = frozenset({pb.DisruptionBudgetStatus.DESCRIPTOR.full_name})


def enum_word(enum: EnumDescriptor, number: int) -> str:
    """An enum value as manifests write it: its name without the prefix every value of the enum
    shares, in CamelCase (``QOS_BEST_EFFORT`` -> ``BestEffort``, ``JOB_RUNNING`` -> ``Running``,
    ``NO_SCHEDULE`` -> ``NoSchedule``). ``_enum_value`` reads every such word back."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)  # a value newer than this client: print it as stored
    name = value.name.removeprefix(_enum_prefix(enum))
    if name in _WORDS:
        return _WORDS[name]
    return "".join(w if w in _ACRONYMS else w.capitalize() for w in name.split("_"))


def _enum_prefix(enum: EnumDescriptor) -> str:
    """The longest ``X_`` prefix shared by every named (non-zero) value of an enum of two or
    more such values, e.g. ``QOS_`` of QOS_GUARANTEED and QOS_BEST_EFFORT."""
    names = [v.name for v in enum.values if v.number != 0]
    if len(names) < 2:
        return ""
    words = [n.split("_") for n in names]
    shared: list[str] = []
    for parts in zip(*words, strict=False):
        if len(set(parts)) != 1 or any(len(w) == len(shared) + 1 for w in words):
            break  # not shared, or it would leave some value without a name
        shared.append(parts[0])
    return "".join(f"{w}_" for w in shared)


def format_cpu(milli: int) -> str:
    """Milli-CPU as Kubernetes writes it: ``2`` for whole cores, else ``500m``."""
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def format_bytes(size: int) -> str | int:
    """Bytes as Kubernetes writes them: the largest unit that divides them exactly (``512Mi``,
    ``1G``), else the plain number."""
    for unit, scale in sorted(
        [*_BINARY.items(), *((u, s) for u, s in _DECIMAL.items() if u != "K")],
        key=lambda item: -item[1],
    ):
        if size and size % scale == 0:
            return f"{size // scale}{unit}"
    return size


def _resources_dict(r: pb.Resources) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if r.milli_cpu:
        out["cpu"] = format_cpu(r.milli_cpu)
    if r.memory_bytes:
        out["memory"] = format_bytes(r.memory_bytes)
    if r.gpus:
        out["gpus"] = r.gpus
    if r.pods:
        out["pods"] = r.pods
    # Extended resources beside the others, as Kubernetes writes `example.com/fpga: 2`.
    out.update(sorted(r.extended.items()))
    return out


def _field_value(fd: Any, value: Any) -> Any:
    if fd.message_type is not None:
        return message_dict(value)
    if fd.enum_type is not None:
        return enum_word(fd.enum_type, value)
    return value


def message_dict(msg: Message) -> dict[str, Any]:
    """A message in the manifest format: camelCase field names, quantities (``500m``, ``1Gi``),
    enum values as words, int64 as numbers; unset fields left out. ``parse_document`` reads it
    back to the same message."""
    if isinstance(msg, pb.Resources):
        return _resources_dict(msg)
    descriptor = msg.DESCRIPTOR
    out: dict[str, Any] = {}
    listed = {fd.name: value for fd, value in msg.ListFields()}
    for fd in descriptor.fields:
        if fd.name not in listed:
            zeros = descriptor.full_name in _PRINT_ZEROS or (
                fd.message_type is not None and fd.message_type.full_name in _PRINT_ZEROS
            )
            if zeros and not fd.is_repeated:
                out[fd.json_name] = _field_value(fd, getattr(msg, fd.name))
            continue
        value = listed[fd.name]
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            value_fd = fd.message_type.fields_by_name["value"]
            out[fd.json_name] = {k: _field_value(value_fd, v) for k, v in sorted(value.items())}
        elif fd.is_repeated:
            out[fd.json_name] = [_field_value(fd, v) for v in value]
        else:
            out[fd.json_name] = _field_value(fd, value)
    return out


def to_manifest(kind: str, obj: Message) -> dict[str, Any]:
    """A stored object as the manifest ``godel get -o yaml`` prints and ``godel apply`` reads."""
    return {"apiVersion": API_VERSION, "kind": kind, **message_dict(obj)}


def to_list(items: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Several manifests as one document, as kubectl prints a listing: ``kind: List``. ``load``
    (and so ``godel apply -f``) reads it as its items."""
    return {"apiVersion": API_VERSION, "kind": "List", "items": list(items)}


def dump_yaml(docs: Iterable[dict[str, Any]]) -> str:
    import yaml

    # libyaml's emitter writes the same text as the pure-Python one, four times faster (20 nodes:
    # 4 ms instead of 15 ms of a `godel get nodes -o yaml`); PyYAML's wheels ship it.
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    return yaml.dump_all(list(docs), Dumper=dumper, sort_keys=False)
