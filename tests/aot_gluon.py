"""Compile ``gluon_attn``'s kernel ahead of time for sm_90a (H100/H200), on a CPU.

CI has no NVIDIA GPU, but Triton's NVIDIA backend compiles to a cubin without one (ptxas ships in the
wheel), and the cubin states what the device would allocate. The launch is not described twice: the
real wrapper (``gluon_varlen_attention``) is called on CPU tensors shaped like the tower's q, k, v
views while ``JITFunction.run`` records its arguments (tests/aot_rocm.py's recorder), Triton's binder
specialises each launch for sm_90 as a launch would, and ``triton.compile`` builds it (through
Gluon's source class for the attention kernel). The wrapper sends CPU tensors to ``triton_attn``, so
the recording pretends the tensors passed ``gluon_unsupported_reason``. Three calls per dtype and head
dim, on an H200's 132 SMs: short ragged segments (one launch of whole two-consumer programs), one
2,176-token image (two-consumer programs, the tail split's, and the merge: backends/tail_split.py)
and one 12,800-token image (the same with three consumers).

What tests/test_gluon_attn.py checks in each record: no spills (ptxas's local memory) and shared
memory that fits an SM; for the attention kernel also that the ``setmaxnreg`` requests of the three
partitions fit the register pool Triton plans (a request that does not fit waits forever on the
GPU), and that it uses ``wgmma`` (``HGMMA``) and TMA (``UTMALDG``).

    .venv/bin/python tests/aot_gluon.py               # one line per specialisation
    .venv/bin/python tests/aot_gluon.py --json PATH   # the records, for tests/test_gluon_attn.py

(A script, not ``-m tests.aot_gluon``: it imports its sibling tests/aot_rocm.py.)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import importlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from aot_rocm import _recording, _specialise
from env_vars import set_env

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# fp16 is compiled at Qwen3-VL's head dim only: its cubins equal bf16's in every field a Record holds
# at every head dim (the same element size, so the same tiles, registers and shared memory; checked
# at 90e05c0), so one head dim shows that it compiles, at a third of bf16's compile time.
FP16_HEAD_DIMS = (72,)
HEADS = 16
TOKENS = 1024  # segments of 196 and 828 tokens: 160 programs of 192 rows, too few for three consumers
# One image each, whose last wave is split on 132 SMs: two consumers (17 query blocks x 16 heads) and
# three (67 x 16).
SPLIT_TOKENS = (2176, 12800)
H200_SMS = 132


@dataclass
class Record:
    """One compiled specialisation and what its cubin and PTX say."""

    kernel: str  # "attention", "attention, tail split" or "merge"
    consumers: int  # the attention kernel's consumer warpgroups (0 for the merge)
    dtype: str
    head_dim: int
    registers: int  # per thread at entry (the kernel-wide cap the partitions share)
    threads: int
    local_bytes: int  # spills and stack
    shared_bytes: int
    setmaxnreg_inc: list[int]  # the partitions' register requests in the PTX (setmaxnreg.inc / .dec)
    setmaxnreg_dec: list[int]
    sass_ops: dict[str, int]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/aot_gluon.py", description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the records to this file instead of printing them")
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the interpreter replaces the JITFunction this harness records", file=sys.stderr)
        return 2
    records = compile_all()
    if args.json:
        Path(args.json).write_text(json.dumps([dataclasses.asdict(record) for record in records], indent=1))
    else:
        for record in records:
            print(record)
    return 0


def compile_all(jobs: int | None = None) -> list[Record]:
    """Every head dim the kernel takes in bf16, and fp16 at ``FP16_HEAD_DIMS``, as the tower's
    fused-qkv views launch it: one (dtype, head dim) per worker process, as many as the machine has
    cores (``jobs``)."""
    pairs = expected_pairs()
    jobs = min(len(pairs), jobs or os.cpu_count() or 1)
    # Nothing is reused across runs: every run compiles from source into a fresh cache.
    with tempfile.TemporaryDirectory(prefix="rocm-vit-aot-") as cache_dir, set_env({"TRITON_CACHE_DIR": cache_dir}):
        if jobs <= 1:
            return [record for pair in pairs for record in _compile_pair(*pair)]
        context = multiprocessing.get_context("spawn")  # the workers inherit the environment above
        dtype_names, head_dims = [pair[0] for pair in pairs], [pair[1] for pair in pairs]
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
            return [record for records in pool.map(_compile_pair, dtype_names, head_dims) for record in records]


def expected_pairs() -> list[tuple[str, int]]:
    """The (dtype, head dim) pairs ``compile_all`` compiles."""
    from rocm_vit.backends import gluon_attn

    return [("bf16", head_dim) for head_dim in gluon_attn.GLUON_HEAD_DIMS] + [("fp16", d) for d in FP16_HEAD_DIMS]


def _compile_pair(dtype_name: str, head_dim: int) -> list[Record]:
    """The records of one dtype and head dim: each kernel and consumer count once."""
    from rocm_vit.backends import gluon_attn

    dtype = DTYPES[dtype_name]
    launches = _launches(gluon_attn, TOKENS, [0, 196, TOKENS], TOKENS - 196, head_dim, dtype)
    for tokens in SPLIT_TOKENS:
        launches += _launches(gluon_attn, tokens, [0, tokens], tokens, head_dim, dtype)
    records, compiled = [], set()
    for fn, args, kwargs in launches:
        kernel, consumers = _kernel_name(fn, kwargs), kwargs.get("CONSUMERS", 0)
        if (kernel, consumers) not in compiled:
            compiled.add((kernel, consumers))
            records.append(_compile(fn, args, kwargs, kernel, consumers, dtype_name, head_dim))
    return records


def _launches(gluon_attn: Any, tokens: int, offsets: list[int], max_seqlen: int, head_dim: int, dtype) -> list:
    """The ``(kernel, args, kwargs)`` of every launch one call makes, on an sm_90 with 132 SMs."""
    q, k, v = torch.empty(tokens, 3, HEADS, head_dim, dtype=dtype).unbind(1)
    cu_seqlens = torch.tensor(offsets, dtype=torch.int32)
    with (
        mock.patch.object(gluon_attn, "gluon_unsupported_reason", lambda *tensors: None),
        mock.patch.object(gluon_attn, "_sm_count", lambda index: H200_SMS),
        _recording() as launches,
    ):
        gluon_attn.gluon_varlen_attention(q, k, v, cu_seqlens, max_seqlen, head_dim**-0.5)
    return launches


def _kernel_name(fn: Any, kwargs: dict) -> str:
    if fn.fn.__name__ == "_merge_kernel":
        return "merge"
    return "attention, tail split" if kwargs["SPLIT"] else "attention"


def _compile(fn: Any, args: tuple, kwargs: dict, kernel: str, consumers: int, dtype_name: str, head_dim: int) -> Record:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    target = GPUTarget("cuda", 90, 32)
    job = _specialise(fn, args, kwargs, "sm_90a", target)
    kernel_fn = getattr(importlib.import_module(job["module"]), job["name"])
    source_class = ASTSource if kernel == "merge" else GluonASTSource
    source = source_class(kernel_fn, job["signature"], job["constexprs"], job["attrs"])
    compiled = triton.compile(source, target=target, options=job["options"])
    ptx = compiled.asm["ptx"]
    usage, sass = _cubin_report(compiled.asm["cubin"])
    return Record(
        kernel=kernel,
        consumers=consumers,
        dtype=dtype_name,
        head_dim=head_dim,
        registers=usage["REG"],
        threads=int(re.search(r"\.(?:reqntid|maxntid) (\d+)", ptx).group(1)),
        local_bytes=usage["LOCAL"] + usage["STACK"],
        shared_bytes=compiled.metadata.shared,
        setmaxnreg_inc=sorted({int(n) for n in re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        setmaxnreg_dec=sorted({int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+)", ptx)}),
        sass_ops=_op_counts(sass, ("HGMMA", "UTMALDG", "SYNCS", "BAR")),
    )


def _cubin_report(cubin: bytes) -> tuple[dict[str, int], str]:
    """``cuobjdump``'s resource usage (REG, STACK, LOCAL, ...) and the SASS of a one-kernel cubin."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as handle:
        handle.write(cubin)
        handle.flush()
        usage_text = subprocess.run(
            [tool, "--dump-resource-usage", handle.name], capture_output=True, text=True, check=True
        ).stdout
        sass = subprocess.run([tool, "--dump-sass", handle.name], capture_output=True, text=True, check=True).stdout
    usage = {name: int(value) for name, value in re.findall(r"\b([A-Z]+):(\d+)", usage_text)}
    return usage, sass


def _op_counts(sass: str, names: tuple[str, ...]) -> dict[str, int]:
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", sass)
    return {name: ops.count(name) for name in names}


if __name__ == "__main__":
    sys.exit(main())
