"""Peak dense FLOP/s per device and precision, for MFU.

Dense (no structured sparsity) tensor-core figures from NVIDIA's datasheets. Datasheets often print the
2:4-sparse number first; MFU against those is off by 2x (Lightning's table, for example, lists the H200's
sparse bf16 figure). Unknown devices give None; set `throughput.device_peak_flops` for them.
"""

from __future__ import annotations

import torch

T = 1e12
# name pattern -> {compute dtype -> dense FLOP/s}; checked in order, the first match wins.
DENSE_PEAK_FLOPS: list[tuple[tuple[str, ...], dict[str, float]]] = [
    (
        ("h200", "nvl"),
        {
            "fp64": 30 * T,
            "fp32": 60 * T,
            "tf32": 417.5 * T,
            "bf16": 835.5 * T,
            "fp16": 835.5 * T,
            "fp8": 1671 * T,
        },
    ),
    (
        ("h200",),
        {
            "fp64": 34 * T,
            "fp32": 67 * T,
            "tf32": 494.7 * T,
            "bf16": 989.4 * T,
            "fp16": 989.4 * T,
            "fp8": 1978.9 * T,
        },
    ),
    (
        ("h100", "nvl"),
        {
            "fp64": 30 * T,
            "fp32": 60 * T,
            "tf32": 417.5 * T,
            "bf16": 835.5 * T,
            "fp16": 835.5 * T,
            "fp8": 1671 * T,
        },
    ),
    (
        ("h100", "pcie"),
        {
            "fp64": 25.6 * T,
            "fp32": 51.2 * T,
            "tf32": 378 * T,
            "bf16": 756 * T,
            "fp16": 756 * T,
            "fp8": 1513 * T,
        },
    ),
    (
        ("h100",),
        {
            "fp64": 33.5 * T,
            "fp32": 66.9 * T,
            "tf32": 494.7 * T,
            "bf16": 989.4 * T,
            "fp16": 989.4 * T,
            "fp8": 1978.9 * T,
        },
    ),
    (
        ("gh200",),
        {
            "fp64": 34 * T,
            "fp32": 67 * T,
            "tf32": 494.7 * T,
            "bf16": 989.4 * T,
            "fp16": 989.4 * T,
            "fp8": 1978.9 * T,
        },
    ),
    (
        ("b200",),
        {
            "fp64": 40 * T,
            "fp32": 75 * T,
            "tf32": 1125 * T,
            "bf16": 2250 * T,
            "fp16": 2250 * T,
            "fp8": 4500 * T,
        },
    ),
    (("a100",), {"fp64": 9.7 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T}),
    (("l40s",), {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362 * T, "fp16": 362 * T, "fp8": 733 * T}),
    (("l4",), {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T, "fp8": 242.5 * T}),
]


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


def dense_peak_flops(device_name: str, precision: str) -> float | None:
    """Peak dense FLOP/s of one device for a Lightning precision, or None if the device is not known."""
    name = device_name.lower()
    dtype = compute_dtype(precision)
    for pattern, table in DENSE_PEAK_FLOPS:
        if all(_has_word(name, part) for part in pattern):
            return table.get(dtype)
    return None


def _has_word(name: str, part: str) -> bool:
    # Whole tokens only: "l4" must not match "l40s".
    return part in name.replace("-", " ").replace("_", " ").split()
