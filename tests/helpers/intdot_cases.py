"""test-backend-ops cases that reach every large integer-dot matmul pipeline (`*_q8_1_l`).

ggml-vulkan picks the large tile when both m and n exceed 64, and the integer-dot (q8_1) pipelines
for these 11 quant types when the device has integer dot products. test-backend-ops' own MUL_MAT
cases reach only one of them (q4_0 576x512x576), so this writes a `--test-file` with, per type, a
tile-aligned case and a ragged one (m, n not multiples of 64). k is small (one or two K-quant
super-blocks) so that lavapipe runs them in seconds.

The file format is test-backend-ops' `make_test_cases_from_file` (b9101): one op per line,
`op type ne0..3 n_params [params] n_src {src_type ne0..3 nb0..3} name`, with enum numbers from
ggml.h at the pin.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

GGML_OP_MUL_MAT = 29
GGML_TYPE_F32 = 0


@dataclass(frozen=True)
class QuantType:
    name: str  # as in the pipeline name, e.g. matmul_q4_k_q8_1_l
    ggml_type: int  # enum ggml_type at b9101
    block: int  # elements per block
    size: int  # bytes per block


# The 11 types with a matmul_<type>_q8_1 pipeline (CREATE_MMQ in ggml_vk_load_shaders at b9101).
QUANT_TYPES = (
    QuantType("q4_0", 2, 32, 18),
    QuantType("q4_1", 3, 32, 20),
    QuantType("q5_0", 6, 32, 22),
    QuantType("q5_1", 7, 32, 24),
    QuantType("q8_0", 8, 32, 34),
    QuantType("q2_k", 10, 256, 84),
    QuantType("q3_k", 11, 256, 110),
    QuantType("q4_k", 12, 256, 144),
    QuantType("q5_k", 13, 256, 176),
    QuantType("q6_k", 14, 256, 210),
    QuantType("mxfp4", 39, 32, 17),
)
# (m, n, k): both m and n > 64 so the large tile is chosen; the second is ragged at both tiles.
SHAPES = ((128, 128, 256), (136, 72, 512))


def pipelines() -> list[str]:
    """The pipeline names the cases must reach."""
    return [f"matmul_{t.name}_q8_1_l" for t in QUANT_TYPES]


def case_line(t: QuantType, m: int, n: int, k: int) -> str:
    """One MUL_MAT case: src0 of type t (m x k), src1 f32 (k x n)."""
    row = k // t.block * t.size
    src0 = [t.ggml_type, k, m, 1, 1, t.size, row, row * m, row * m]
    src1 = [GGML_TYPE_F32, k, n, 1, 1, 4, 4 * k, 4 * k * n, 4 * k * n]
    fields = [GGML_OP_MUL_MAT, GGML_TYPE_F32, m, n, 1, 1, 0, 2, *src0, *src1, "-"]
    return " ".join(str(f) for f in fields)


def case_lines() -> list[str]:
    return [case_line(t, m, n, k) for t in QUANT_TYPES for m, n, k in SHAPES]


def write_cases(path: Path) -> Path:
    path.write_text("\n".join(case_lines()) + "\n")
    return path


if __name__ == "__main__":
    print(write_cases(Path(sys.argv[1])))
