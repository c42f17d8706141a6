"""Which of a node's GPUs this process sees, and under which torch ordinal: NVIDIA (CUDA) and AMD (ROCm).

The GPU libraries number every GPU of the node; torch numbers only those the visibility variables leave,
from 0. These functions map each torch ordinal to the GPU library's device, so that `system/gpu_<i>_...`
is the device `cuda:i` of this job, and no other GPU of a shared node is reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence


def visible_gpu_uuids(
    cuda_visible_devices: str | None,
    nvml_uuids: Sequence[str],
    gpu_ordinals: Iterable[int] | None = None,
) -> dict[int, str]:
    """Map each CUDA ordinal this job sees to the NVML UUID of the device behind it.

    Follows CUDA's reading of ``CUDA_VISIBLE_DEVICES`` (as ``torch.cuda`` models it): unset means every
    GPU; entries are NVML indices (leading digits count, like ``strtoul``), ``GPU-`` UUID prefixes or
    ``MIG-`` UUIDs; the first invalid or ambiguous entry ends the list; a repeated device hides them all.
    ``nvml_uuids`` are the node's GPU UUIDs in NVML index order; index entries assume CUDA numbers GPUs
    in that (PCI bus) order, as it does for identical GPUs or with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``.
    ``gpu_ordinals`` keeps only those CUDA ordinals, e.g. the devices of this node's local ranks.
    """
    if cuda_visible_devices is None:
        visible = list(nvml_uuids)
    else:
        visible = []
        for entry in (entry.strip() for entry in cuda_visible_devices.split(",")):
            uuid = _resolve_visible_entry(entry, nvml_uuids)
            if uuid is None:
                break
            if uuid in visible:
                return {}
            visible.append(uuid)
    wanted = None if gpu_ordinals is None else set(gpu_ordinals)
    return {ordinal: uuid for ordinal, uuid in enumerate(visible) if wanted is None or ordinal in wanted}


def rocm_visible_gpu_uuids(
    environ: Mapping[str, str], rocm_uuids: Sequence[str], gpu_ordinals: Iterable[int] | None = None
) -> dict[int, str]:
    """Map each torch ordinal on ROCm to the UUID (``GPU-<serial>``) of the AMD GPU, or MI250X GCD, behind it.

    ROCm reads two levels: ``ROCR_VISIBLE_DEVICES`` (indices or UUIDs) selects from the node's GPUs first,
    then ``HIP_VISIBLE_DEVICES`` (or, when unset, ``CUDA_VISIBLE_DEVICES``, which HIP also honours) selects
    from what is left, by position in that list. Entries are read as ``visible_gpu_uuids`` reads CUDA's;
    UUIDs case-insensitively. ``rocm_uuids`` are the node's GPUs in HIP's order (the order of its HIP ids).
    """
    uuids = [uuid.lower() for uuid in rocm_uuids]
    rocr = environ.get("ROCR_VISIBLE_DEVICES")
    after_rocr = uuids if rocr is None else list(visible_gpu_uuids(rocr.lower(), uuids).values())
    hip = environ.get("HIP_VISIBLE_DEVICES", environ.get("CUDA_VISIBLE_DEVICES"))
    return visible_gpu_uuids(None if hip is None else hip.lower(), after_rocr, gpu_ordinals)


def _resolve_visible_entry(entry: str, uuids: Sequence[str]) -> str | None:
    """The UUID one visibility entry names, or None where CUDA would stop reading."""
    if entry.startswith("MIG-"):
        return entry
    if entry[:4].upper() == "GPU-":
        matches = [uuid for uuid in uuids if uuid.startswith(entry)]
        return matches[0] if len(matches) == 1 else None
    index = re.match(r"\d+", entry)
    if index is None or int(index.group()) >= len(uuids):
        return None
    return uuids[int(index.group())]
