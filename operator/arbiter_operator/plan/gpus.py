"""What the operator knows of a GPU product from its name: compute capability and memory (pure).

`spec.serving.gpuProduct` is matched on the `nvidia.com/gpu.product` node label that NVIDIA GPU Feature Discovery
writes: the CUDA device name with spaces as dashes, e.g. `NVIDIA-H100-80GB-HBM3`, `NVIDIA-A100-SXM4-40GB`,
`Tesla-T4`, `Tesla-V100-SXM2-16GB`, `NVIDIA-L40S`, and with MIG `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`. The name is all
the spec says of the GPU, so the quantization and memory checks read the family (compute capability) and the memory
from it: the `NNGB` part when the name has one (the slice's when it is a MIG profile), else the family's usual
memory. A name that matches no family is unknown: nothing is judged on it (the checks say so), rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class GpuProduct:
    label: str  # as written in spec.serving.gpuProduct
    family: str  # e.g. H100, A100, T4
    capability: tuple[int, int]  # CUDA compute capability
    memory_gib: float  # per GPU (per MIG slice for a MIG profile)

    @property
    def capability_text(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}"


# (family, compute capability, usual memory in GiB), matched on a whole dash-separated part of the name (so `L4`
# does not match `L40`). The families vLLM serves on; the first whose name appears wins, longest names first.
_FAMILIES: tuple[tuple[str, tuple[int, int], float], ...] = (
    ("GB300", (10, 3), 279.0), ("B300", (10, 3), 268.0), ("GB200", (10, 0), 186.0), ("B200", (10, 0), 179.0),
    ("B100", (10, 0), 179.0), ("RTX-PRO-6000", (12, 0), 96.0), ("RTX-5090", (12, 0), 32.0),
    ("GH200", (9, 0), 96.0), ("H200", (9, 0), 141.0), ("H100-NVL", (9, 0), 94.0), ("H100", (9, 0), 80.0),
    ("H800", (9, 0), 80.0),
    ("H20", (9, 0), 96.0),
    ("L40S", (8, 9), 48.0), ("L40", (8, 9), 48.0), ("L20", (8, 9), 48.0), ("L4", (8, 9), 24.0),
    ("RTX-4090", (8, 9), 24.0), ("RTX-6000-Ada", (8, 9), 48.0),
    ("A100", (8, 0), 40.0), ("A800", (8, 0), 80.0), ("A30", (8, 0), 24.0),
    ("A40", (8, 6), 48.0), ("A10G", (8, 6), 24.0), ("A10", (8, 6), 24.0), ("A16", (8, 6), 16.0),
    ("A2", (8, 6), 16.0), ("RTX-A6000", (8, 6), 48.0), ("RTX-3090", (8, 6), 24.0),
    ("T4", (7, 5), 15.0), ("RTX-8000", (7, 5), 48.0), ("RTX-6000", (7, 5), 24.0),
    ("V100", (7, 0), 16.0), ("V100S", (7, 0), 32.0),
    ("P100", (6, 0), 16.0), ("P40", (6, 1), 24.0), ("P4", (6, 1), 8.0), ("K80", (3, 7), 12.0),
)
# Superchips name the module's memory, CPU memory included: their GPU's is the family's.
_MODULE_MEMORY = frozenset({"GH200", "GB200", "GB300"})
_MIG = re.compile(r"-MIG-\d+g\.(\d+)gb", re.IGNORECASE)
_MEMORY = re.compile(r"(?:^|-)(\d{1,4})GB(?:-|$)", re.IGNORECASE)


def _has_part(name: str, family: str) -> bool:
    """Whether `family` (which may itself hold dashes) stands in `name` as whole dash-separated parts."""
    return re.search(rf"(?:^|-){re.escape(family)}(?:-|$)", name, re.IGNORECASE) is not None


def gpu_product(label: str | None) -> GpuProduct | None:
    """The product a gpuProduct label names, or None when unset or of no family known here."""
    if not label:
        return None
    name = label.strip().replace(" ", "-")
    for family, capability, usual in sorted(_FAMILIES, key=lambda f: -len(f[0])):
        if _has_part(name, family):
            mig = _MIG.search(name)
            if mig:
                return GpuProduct(label, family, capability, float(mig.group(1)))
            memory = None if family in _MODULE_MEMORY else _MEMORY.search(name)
            return GpuProduct(label, family, capability, float(memory.group(1)) if memory else usual)
    return None
