"""The cuBLASLt host experiment's pure parts: the row-major to column-major mapping and the alignments torch
reports. Its ctypes calls run only on a GPU, where the script checks itself against torch bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.gpu_cublaslt_host_bench import alignment, lt_problem


def test_lt_problem_computes_the_transpose_of_linear_in_column_major():
    """D [width, rows] column-major is out [rows, width] row-major: checked by doing the column-major
    product with the mapping's sizes and leading dimensions on flat buffers."""
    rows, depth, width = 5, 7, 3
    x, weight = torch.randn(rows, depth, dtype=torch.float64), torch.randn(width, depth, dtype=torch.float64)
    p = lt_problem(rows, depth, width)
    # Column-major views of the flat row-major buffers: element (i, j) at i + j * ld.
    a = x.new_tensor(weight.flatten()).as_strided((p["k"], p["m"]), (1, p["lda"]))  # A, then op(A) = Aᵀ
    b = x.new_tensor(x.flatten()).as_strided((p["k"], p["n"]), (1, p["ldb"]))
    d = torch.empty(p["m"] * p["n"], dtype=torch.float64)
    d.as_strided((p["m"], p["n"]), (1, p["ldd"])).copy_(a.t() @ b)
    torch.testing.assert_close(d.view(rows, width), x @ weight.t(), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("address", "expected"), [(0x1000, 16), (0x1008, 8), (0x1004, 4), (0x1002, 2), (0x1001, 1)])
def test_alignment_is_the_largest_power_of_two_up_to_16_dividing_the_address(address, expected):
    assert alignment(address) == expected
