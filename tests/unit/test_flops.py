"""Dense peak FLOP/s: the parts added for anemoi's machines (AMD Instinct per GCD or partition) and the older
NVIDIA parts, with device names as torch reports them on CUDA and on ROCm."""

from __future__ import annotations

import pytest
import torch

from anemoi_profiler.measure.flops import DENSE_PEAK_FLOPS, dense_peak_flops

T = 1e12


@pytest.mark.parametrize(
    ("name", "precision", "units", "expected"),
    [
        pytest.param("AMD Instinct MI250X/MI250", "bf16-mixed", 110, 191.5 * T, id="mi250x-gcd-half-the-package"),
        pytest.param("AMD Instinct MI250X/MI250", "bf16-mixed", 104, 181.05 * T, id="mi250-gcd-same-name-fewer-cus"),
        pytest.param("AMD Instinct MI250X/MI250", "16-mixed", None, 191.5 * T, id="mi250x-when-cus-unknown"),
        pytest.param("AMD Instinct MI250X", "32-true", 110, 47.85 * T, id="mi250x-no-tf32-runs-fp32"),
        pytest.param("AMD Instinct MI250", "bf16-mixed", 104, 181.05 * T, id="mi250"),
        pytest.param("AMD Instinct MI300X", "bf16-mixed", 304, 1307.4 * T, id="mi300x"),
        pytest.param("AMD Instinct MI300X", "bf16-mixed", 38, 1307.4 * T / 8, id="mi300x-cpx-partition"),
        pytest.param("AMD Instinct MI300A", "bf16-true", 228, 980.6 * T, id="mi300a"),
        pytest.param("AMD Instinct MI210", "16-mixed", 104, 181 * T, id="mi210"),
        pytest.param("Tesla V100-SXM2-32GB", "16-mixed", 80, 125 * T, id="v100-sxm2-fp16"),
        pytest.param("Tesla V100-PCIE-16GB", "16-mixed", 80, 112 * T, id="v100-pcie"),
        pytest.param("Tesla V100S-PCIE-32GB", "16-mixed", 80, 130 * T, id="v100s"),
        pytest.param("Tesla V100-SXM2-32GB", "bf16-mixed", 80, None, id="v100-has-no-bf16-tensor-cores"),
        pytest.param("Tesla T4", "16-mixed", 40, 65 * T, id="t4-fp16"),
        pytest.param("Tesla T4", "bf16-mixed", 40, None, id="t4-has-no-bf16-tensor-cores"),
        pytest.param("NVIDIA A10", "bf16-mixed", 72, 125 * T, id="a10-not-a100"),
        pytest.param("NVIDIA A40", "bf16-mixed", 84, 149.7 * T, id="a40"),
        pytest.param("NVIDIA L40", "bf16-mixed", 142, 181 * T, id="l40-not-l40s"),
        pytest.param("NVIDIA H100 80GB HBM3", "bf16-mixed", 132, 989.4 * T, id="nvidia-ignores-sm-count"),
        pytest.param("AMD Radeon PRO W7900", "bf16-mixed", 96, None, id="unknown"),
    ],
)
def test_dense_peaks_per_torch_device(name: str, precision: str, units: int | None, expected: float | None) -> None:
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # 32-true asks for TF32 where the part has it
    try:
        assert dense_peak_flops(name, precision, units) == (pytest.approx(expected, rel=1e-3) if expected else None)
    finally:
        torch.set_float32_matmul_precision(previous)


def test_a_part_without_tf32_gives_its_fp32_figure_and_one_with_tf32_its_tf32_figure() -> None:
    previous = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert dense_peak_flops("Tesla V100-SXM2-32GB", "32-true") == pytest.approx(15.7 * T)
        assert dense_peak_flops("AMD Instinct MI300X", "32-true", 304) == pytest.approx(653.7 * T)
        torch.set_float32_matmul_precision("highest")
        assert dense_peak_flops("AMD Instinct MI300X", "32-true", 304) == pytest.approx(163.4 * T)
    finally:
        torch.set_float32_matmul_precision(previous)


def test_no_entry_hides_a_later_more_specific_one() -> None:
    """The first match wins: an entry whose words include an earlier entry's must come before it."""
    for later_index, later in enumerate(DENSE_PEAK_FLOPS):
        for earlier in DENSE_PEAK_FLOPS[:later_index]:
            assert not set(earlier.pattern) <= set(later.pattern), (earlier.pattern, later.pattern)
