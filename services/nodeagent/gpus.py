"""GPU cards as the node agent reports them: model names (``V100M32``, ``T4``), this machine's
cards from ``nvidia-smi``, and the environment that shows a process pod the cards it holds.

A node's cards share one model and are indexed ``0 .. allocatable.gpus - 1`` (the indices the
Binder writes into ``spec.gpu_cards`` and ``nvidia-smi`` prints), so a pod's cards are its
``CUDA_VISIBLE_DEVICES`` as they are.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from protos.godel.v1 import objects_pb2 as pb

log = structlog.get_logger(__name__)

NVIDIA_SMI = "nvidia-smi"
NVIDIA_SMI_QUERY = ("--query-gpu=index,name", "--format=csv,noheader")
NVIDIA_SMI_TIMEOUT_SECONDS = 10.0
# Milli of one card a pod holds wholly (GODEL_GPU_MILLI of a whole-card pod).
WHOLE_CARD_MILLI = 1000

# A model name: what the trace and `--hollow-gpu-model` spell (V100M32, T4, A100M80, G2, ...).
_MODEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")
# The vendors' words that name no model ("NVIDIA Tesla V100-SXM2-32GB" is a V100 of 32 GB).
_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
# Families sold in several memory sizes, named <family>M<GB> as the openb trace names V100s.
_SIZED_FAMILIES = frozenset({"V100", "A100", "H100", "A800", "H800"})
_MEMORY = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def model_problem(model: str) -> str | None:
    """Why ``model`` is not a GPU model name (letters, digits, '.', '_', '-'; at most 63,
    starting and ending with a letter or digit), or None."""
    if _MODEL.match(model):
        return None
    return (
        f"{model!r} is not a GPU model name (letters, digits, '.', '_' or '-', at most 63, "
        "e.g. V100M32)"
    )


def model_of(name: str) -> str:
    """The model string of a card as ``nvidia-smi`` names it: ``Tesla V100-SXM2-32GB`` →
    ``V100M32``, ``Tesla T4`` → ``T4``, ``NVIDIA A10`` → ``A10``, ``Tesla P100-PCIE-16GB`` →
    ``P100``; any other the name without vendor words, upper-case, words joined by '-'
    (``NVIDIA GeForce RTX 3090`` → ``RTX-3090``)."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", name.upper()) if w and w not in _VENDOR_WORDS]
    if not words:
        return "UNKNOWN"
    family = words[0]
    if family in _SIZED_FAMILIES and (memory := _MEMORY.search(name)):
        return f"{family}M{memory.group(1)}"
    if re.fullmatch(r"[A-Z]+\d+[A-Z]?", family):
        return family  # a data-centre card named by its family alone: T4, P100, A10, L40S
    return "-".join(words)[:63].rstrip("-")


@dataclass(frozen=True, slots=True)
class MachineGpus:
    """This machine's cards as a node reports them: their count and their model."""

    cards: int = 0
    model: str = ""


NO_GPUS = MachineGpus()


def parse_nvidia_smi(output: str) -> MachineGpus:
    """``nvidia-smi --query-gpu=index,name --format=csv,noheader`` output (``0, Tesla T4`` a
    line) as the node's cards. A node's cards share one model: on a machine of mixed cards the
    most common model is reported (the others counted as it), and that is logged."""
    names: dict[int, str] = {}
    for line in output.splitlines():
        index, sep, name = line.partition(",")
        if not sep or not index.strip().isdigit():
            continue  # a warning nvidia-smi printed, or a blank line
        names[int(index.strip())] = name.strip()
    if not names:
        return NO_GPUS
    models = Counter(model_of(n) for n in names.values())
    model = models.most_common(1)[0][0]
    if len(models) > 1:
        log.warning("this machine's GPUs are of several models: all reported as one", model=model)
    return MachineGpus(cards=len(names), model=model)


def machine_gpus(command: str = NVIDIA_SMI) -> MachineGpus:
    """This machine's cards, asked of ``nvidia-smi``; none where it is not installed or fails
    (no driver, no device: logged)."""
    path = shutil.which(command)
    if path is None:
        return NO_GPUS
    try:
        done = subprocess.run(
            [path, *NVIDIA_SMI_QUERY],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("nvidia-smi did not answer: no GPUs reported", error=str(exc))
        return NO_GPUS
    if done.returncode != 0:
        log.warning(
            "nvidia-smi failed: no GPUs reported",
            exit_code=done.returncode,
            error=" ".join(done.stderr.split())[:200],
        )
        return NO_GPUS
    return parse_nvidia_smi(done.stdout)


def gpu_env(pod: pb.Pod) -> dict[str, str]:
    """What a process pod is told of its cards: ``CUDA_VISIBLE_DEVICES`` the indices the Binder
    assigned (``"0,1"``; empty, so it sees none, when it holds none) and ``GODEL_GPU_MILLI`` the
    milli of each it holds (its share, 1..999; 1000 for whole cards; 0 for none)."""
    cards: Sequence[int] = pod.spec.gpu_cards
    milli = (pod.spec.template.gpu_milli or WHOLE_CARD_MILLI) if cards else 0
    return {
        "CUDA_VISIBLE_DEVICES": ",".join(str(c) for c in cards),
        "GODEL_GPU_MILLI": str(milli),
    }
