"""Peak dense FLOP/s per device and precision, for MFU.

Dense (no structured sparsity) matrix/tensor-core figures from the vendors' datasheets. Datasheets often
print the 2:4-sparse number first; MFU against those is off by 2x (Lightning's table, for example, lists the
H200's sparse bf16 figure). Unknown devices, and precisions a part has no matrix units for (bf16 on V100
and T4), give None; set `throughput.device_peak_flops` for them. A part without TF32 runs "32-true"
matmuls in FP32, so its FP32 figure is used then.

AMD: each MI250X/MI250 GCD and each MI300 partition is its own torch device, so the figures are per device:
an entry's figure holds for its `compute_units` and scales with the device's own count (torch's
`multi_processor_count`). That also tells an MI250 (104 CUs per GCD) from an MI250X (110), which ROCm names
alike ("AMD Instinct MI250X/MI250"), and gives a CPX partition of an MI300X its share.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

T = 1e12


class Peak(NamedTuple):
    pattern: tuple[str, ...]
    """Words that must all be in the device name (lower case; `-`, `_`, `/` split words)."""
    flops: dict[str, float]
    """Compute dtype -> dense FLOP/s."""
    compute_units: int | None = None
    """The compute units the figures are for (AMD), to scale to a device with another count."""


_HOPPER = {"fp64": 34 * T, "fp32": 67 * T, "tf32": 494.7 * T, "bf16": 989.4 * T, "fp16": 989.4 * T, "fp8": 1978.9 * T}
_HOPPER_NVL = {"fp64": 30 * T, "fp32": 60 * T, "tf32": 417.5 * T, "bf16": 835.5 * T, "fp16": 835.5 * T, "fp8": 1671 * T}

# Checked in order, the first match wins: more specific names first.
DENSE_PEAK_FLOPS: list[Peak] = [
    # NVIDIA: H100/H200 Tensor Core GPU datasheets (SXM and NVL/PCIe columns), GH200 datasheet
    Peak(("h200", "nvl"), _HOPPER_NVL),
    Peak(("h200",), _HOPPER),
    Peak(("h100", "nvl"), _HOPPER_NVL),
    Peak(("h100", "pcie"),
         {"fp64": 25.6 * T, "fp32": 51.2 * T, "tf32": 378 * T, "bf16": 756 * T, "fp16": 756 * T, "fp8": 1513 * T}),
    Peak(("h100",), {**_HOPPER, "fp64": 33.5 * T, "fp32": 66.9 * T}),
    Peak(("gh200",), _HOPPER),
    # DGX B200 / HGX B200 datasheets, per GPU
    Peak(("b200",),
         {"fp64": 40 * T, "fp32": 75 * T, "tf32": 1125 * T, "bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T}),
    # A100, A40, A10 datasheets (Ampere)
    Peak(("a100",), {"fp64": 9.7 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T}),
    Peak(("a40",), {"fp32": 37.4 * T, "tf32": 74.8 * T, "bf16": 149.7 * T, "fp16": 149.7 * T}),
    Peak(("a10",), {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T}),
    # L40S, L40, L4 datasheets (Ada)
    Peak(("l40s",), {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362 * T, "fp16": 362 * T, "fp8": 733 * T}),
    Peak(("l40",), {"fp32": 90.5 * T, "tf32": 90.5 * T, "bf16": 181 * T, "fp16": 181 * T, "fp8": 362 * T}),
    Peak(("l4",), {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T, "fp8": 242.5 * T}),
    # V100 datasheet (SXM2, PCIe, V100S PCIe) and T4 datasheet: fp16 tensor cores only, no bf16, no TF32
    Peak(("v100s",), {"fp64": 8.2 * T, "fp32": 16.4 * T, "fp16": 130 * T}),
    Peak(("v100", "pcie"), {"fp64": 7 * T, "fp32": 14 * T, "fp16": 112 * T}),
    Peak(("v100",), {"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T}),
    Peak(("t4",), {"fp32": 8.1 * T, "fp16": 65 * T}),
    # AMD Instinct MI300X and MI300A data sheets (matrix figures, dense; whole GPU in SPX mode)
    Peak(("mi300x",),
         {"fp64": 163.4 * T, "fp32": 163.4 * T, "tf32": 653.7 * T, "bf16": 1307.4 * T, "fp16": 1307.4 * T,
          "fp8": 2614.9 * T}, compute_units=304),
    Peak(("mi300a",),
         {"fp64": 122.6 * T, "fp32": 122.6 * T, "tf32": 490.3 * T, "bf16": 980.6 * T, "fp16": 980.6 * T,
          "fp8": 1961.2 * T}, compute_units=228),
    # MI250X and MI250 data sheets, halved: the package's two GCDs are two torch devices (no TF32, no sparsity)
    Peak(("mi250x",), {"fp64": 47.85 * T, "fp32": 47.85 * T, "bf16": 191.5 * T, "fp16": 191.5 * T},
         compute_units=110),
    Peak(("mi250",), {"fp64": 45.25 * T, "fp32": 45.25 * T, "bf16": 181.05 * T, "fp16": 181.05 * T},
         compute_units=104),
    # MI210 data sheet (one die)
    Peak(("mi210",), {"fp64": 45.3 * T, "fp32": 45.3 * T, "bf16": 181 * T, "fp16": 181 * T}, compute_units=104),
]  # fmt: skip


def compute_dtype(precision: str) -> str:
    """The matmul dtype of a Lightning precision setting ('bf16-mixed' -> 'bf16', '32-true' -> 'tf32'/'fp32')."""
    precision = str(precision)
    if "bf16" in precision:
        return "bf16"
    if "transformer-engine" in precision or "fp8" in precision:
        return "fp8"
    if precision.startswith("16"):
        return "fp16"
    if precision.startswith("64"):
        return "fp64"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def dense_peak_flops(device_name: str, precision: str, compute_units: int | None = None) -> float | None:
    """Peak dense FLOP/s of one device for a Lightning precision, or None if the device or precision is not known.

    `compute_units` (torch's `multi_processor_count`) scales an AMD figure to the device's share of the part.
    """
    words = set(device_name.lower().replace("-", " ").replace("_", " ").replace("/", " ").split())
    dtype = compute_dtype(precision)
    for peak in DENSE_PEAK_FLOPS:
        if not all(part in words for part in peak.pattern):  # whole words: "l4" must not match "l40s"
            continue
        flops = peak.flops.get(dtype)
        if flops is None and dtype == "tf32":
            flops = peak.flops.get("fp32")  # no TF32 units: such a part runs FP32 matmuls in FP32
        if flops is not None and peak.compute_units and compute_units:
            flops *= compute_units / peak.compute_units
        return flops
    return None
