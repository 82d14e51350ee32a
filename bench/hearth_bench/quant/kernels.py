"""``scripts/bench quant --kernels``: the linear kernels on one decoder layer's matrices.

For the Qwen2.5-1.5B and Llama-3.2-3B layer shapes (q/k/v fused, o, gate/up fused,
down), ``COPIES`` copies of each matrix are cycled so that none stays in cache, and each
kernel is timed per layer (wall time, the engine's threads):

* ``hearth-int4`` / ``hearth-int8``: Hearth's packed tiles (``QuantPlan``; rows up to
  16) and, for prefill rows, dequantize-then-GEMM (what ``QuantLinear`` does);
  ``hearth-int6-g16`` and ``hearth-int8-g16``: a GGUF Q6_K matrix's form, and the int8
  form it had before;
* ``torch-int4pack``: ``_weight_int4pack_mm_for_cpu`` on
  ``_convert_weight_to_int4pack_for_cpu`` weights (group 32, bfloat16 scales and zeros);
* ``torch-int8pack``: ``_weight_int8pack_mm`` (per-channel; rows up to 16 only);
* ``bf16``: ``F.linear`` on bfloat16 weights (oneDNN, AMX where present).

GB/s is the kernel's weight bytes over the time: the decode figure of merit.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from hearth_engine.model.quant.linear import QuantLinear, quantize_int4, quantize_int8_groups
from hearth_engine.model.quant.tiles import pack

from ..common import print_table

COPIES = 3
SHAPES = {
    "qwen2.5-1.5b": [(2048, 1536), (1536, 1536), (17920, 1536), (1536, 8960)],
    "llama-3.2-3b": [(5120, 3072), (3072, 3072), (16384, 3072), (3072, 8192)],
}
DECODE_ROWS = (1, 4, 16)
PREFILL_ROWS = (256, 1024)


def _time(fn: Callable[[], Any], budget_s: float = 0.5) -> float:
    fn()
    reps, started = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        elapsed = time.perf_counter() - started
        if elapsed > budget_s or reps >= 50:
            return elapsed / reps


class Layer:
    """``COPIES`` copies of one layer's matrices in every form timed."""

    def __init__(self, shapes: list[tuple[int, int]]) -> None:
        self.mats: list[dict[str, Any]] = []
        for n, k in shapes:
            for _ in range(COPIES):
                w = torch.randn(n, k) * 0.02
                q = torch.randint(0, 16, (n, k), dtype=torch.int32)
                s16 = torch.rand(n, k // 16) * 0.001
                self.mats.append({
                    "n": n, "k": k,
                    "bf16": w.bfloat16(),
                    "int4": QuantLinear([quantize_int4(w)], None),
                    "int8": QuantLinear([quantize_int8_groups(w)], None),
                    "int6-g16": QuantLinear([pack(q - 8, s16, None, 16, 6)], None),
                    "int8-g16": QuantLinear([pack(q - 8, s16, None, 16, 8)], None),
                    "tpack": torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 8),
                    "tsz": torch.randn(k // 32, n, 2, dtype=torch.bfloat16) * 0.01,
                    "t8": torch.randint(-127, 127, (n, k), dtype=torch.int8),
                    "t8s": torch.rand(n, dtype=torch.bfloat16),
                })  # fmt: skip

    def run(self, kernel: str, rows: int) -> tuple[float, float]:
        """(ms per layer, weight GB/s) of ``kernel`` at ``rows`` rows."""
        total, nbytes = 0.0, 0
        for m in self.mats:
            x = torch.randn(rows, m["k"], dtype=torch.bfloat16)
            fn, size = self._kernel(kernel, m, x)
            total += _time(fn)
            nbytes += size
        return total / COPIES * 1000, nbytes / total / 1e9

    @staticmethod
    def _kernel(kernel: str, m: dict[str, Any], x: torch.Tensor) -> tuple[Callable[[], Any], int]:
        n, k = m["n"], m["k"]
        if kernel == "bf16":
            return (lambda: torch.nn.functional.linear(x, m["bf16"])), n * k * 2
        if kernel.startswith("hearth-"):
            linear = m[kernel.removeprefix("hearth-")]
            return (lambda: linear(x)), linear.nbytes
        if kernel == "torch-int4pack":
            op = torch.ops.aten._weight_int4pack_mm_for_cpu
            return (lambda: op(x, m["tpack"], 32, m["tsz"])), n * k // 2 + m["tsz"].numel() * 2
        if kernel == "torch-int8pack":
            return (lambda: torch._weight_int8pack_mm(x, m["t8"], m["t8s"])), n * k
        raise ValueError(kernel)


def main(args: argparse.Namespace) -> int:
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    rows_out = []
    kernels = (
        "hearth-int4",
        "hearth-int6-g16",
        "hearth-int8-g16",
        "hearth-int8",
        "torch-int4pack",
        "torch-int8pack",
        "bf16",
    )
    for shape, matrices in SHAPES.items():
        layer = Layer(matrices)
        for rows in (*DECODE_ROWS, *PREFILL_ROWS):
            for kernel in kernels:
                if kernel == "torch-int8pack" and rows > 16:
                    continue
                ms, gbs = layer.run(kernel, rows)
                rows_out.append([shape, rows, kernel, round(ms, 2), round(gbs, 1)])
                print(*rows_out[-1], flush=True)
        del layer
    print(f"load average: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
    print_table(["shape", "rows", "kernel", "ms_per_layer", "weight_GB_s"], rows_out)
    return 0
