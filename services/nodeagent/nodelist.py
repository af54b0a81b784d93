"""A list of hollow nodes, each of its own shape, from a CSV file as the openb trace's node lists
are written (``sn,cpu_milli,memory_mib,gpu,model``): a mixed cluster of GPU models and CPU-only
nodes. Every row is checked before any node is made; a bad one is a ValueError naming the file,
the line, the node and the field.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from services.nodeagent.gpus import model_problem

MiB = 1 << 20
COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
# A node's name: a DNS-1123 name as the store holds it, and short enough to be its hostname label.
_NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")
_PART = re.compile(r"^(\d+)/(\d+)$")


@dataclass(frozen=True, slots=True)
class ListedNode:
    """One row: the node's name and its guaranteed cpu, memory, cards and their model."""

    name: str
    milli_cpu: int
    memory_bytes: int
    gpus: int
    gpu_model: str


def load_node_list(path: str | Path) -> list[ListedNode]:
    """Every node of the CSV file at ``path`` (see :func:`parse_node_list`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte offset {exc.start})") from None
    return parse_node_list(text, str(path))


def parse_node_list(text: str, source: str = "<node list>") -> list[ListedNode]:
    """The rows of a node list: a header naming at least the columns ``sn, cpu_milli,
    memory_mib, gpu, model`` (in any order; others are ignored), then one node a row. ``gpu``
    cards need a ``model``, a model needs cards; counts are non-negative integers; names are
    unique DNS-1123 names of at most 63 characters."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise ValueError(f"{source}: empty (a header {','.join(COLUMNS)} and a row per node)")
    header = [h.strip() for h in header]
    missing = [c for c in COLUMNS if c not in header]
    if missing:
        raise ValueError(
            f"{source} line 1: header lacks column(s) {', '.join(missing)} "
            f"(expected {','.join(COLUMNS)})"
        )
    at = {c: header.index(c) for c in COLUMNS}
    nodes: list[ListedNode] = []
    seen: dict[str, int] = {}
    for row in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue  # a blank line
        node = _parse_row(row, at, len(header), f"{source} line {line}")
        if node.name in seen:
            raise ValueError(
                f"{source} line {line} ({node.name}): sn: duplicate of line {seen[node.name]}"
            )
        seen[node.name] = line
        nodes.append(node)
    if not nodes:
        raise ValueError(f"{source}: lists no node")
    return nodes


def _parse_row(row: Sequence[str], at: dict[str, int], width: int, where: str) -> ListedNode:
    if len(row) != width:
        raise ValueError(f"{where}: {len(row)} fields, the header has {width}")
    cell = {c: row[i].strip() for c, i in at.items()}
    name = cell["sn"]
    if not _NODE_NAME.match(name):
        raise ValueError(
            f"{where}: sn: {name!r} is not a node name (lowercase letters, digits, '-' and '.', "
            "at most 63, starting and ending with a letter or digit)"
        )
    here = f"{where} ({name})"
    cpu, memory_mib, gpus = (
        _count(cell[c], f"{here}: {c}") for c in ("cpu_milli", "memory_mib", "gpu")
    )
    model = cell["model"]
    if gpus and not model:
        raise ValueError(f"{here}: model: {gpus} GPU cards need their model (e.g. V100M32)")
    if model and not gpus:
        raise ValueError(f"{here}: gpu: model {model!r} given to a node of 0 cards")
    if model and (problem := model_problem(model)) is not None:
        raise ValueError(f"{here}: model: {problem}")
    return ListedNode(name, cpu, memory_mib * MiB, gpus, model)


def _count(text: str, where: str) -> int:
    if not re.fullmatch(r"-?\d+", text):
        raise ValueError(f"{where}: {text!r} is not an integer")
    value = int(text)
    if value < 0:
        raise ValueError(f"{where}: must not be negative (got {value})")
    return value


def parse_part(text: str) -> tuple[int, int]:
    """``"INDEX/COUNT"`` (``"1/4"``: the second of four parts) as (index, count)."""
    m = _PART.match(text.strip())
    if m is None or not int(m.group(1)) < int(m.group(2)):
        raise ValueError(f"{text!r} is not INDEX/COUNT with 0 <= INDEX < COUNT (e.g. 0/1)")
    return int(m.group(1)), int(m.group(2))


def node_list_part(nodes: Sequence[ListedNode], index: int, count: int) -> list[ListedNode]:
    """The ``index``-th of ``count`` contiguous parts of the list, as `godel up` splits it among
    its node agents (the first parts one longer when it does not divide evenly)."""
    size, extra = divmod(len(nodes), count)
    start = index * size + min(index, extra)
    return list(nodes[start : start + size + (1 if index < extra else 0)])
