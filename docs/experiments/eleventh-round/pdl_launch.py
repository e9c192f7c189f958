"""#15, eleventh round: what a programmatic dependent launch (PDL) saves per Triton kernel in the tower's graph.

The 8B block at 196 rows alternates cuBLAS GEMMs and small Triton kernels (add+norm, rotary,
attention). Here each Triton kernel is a stand-in with the same bytes (read one activation, write
one), launched with or without PDL: with it, the kernel may be scheduled while the previous kernel
drains and waits (`griddepcontrol.wait`) before its first load. Timed as graph replays of 27 blocks;
outputs compared bitwise between the two.

    PYTHONPATH=$PWD python docs/experiments/eleventh-round/pdl_launch.py
"""

import statistics

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def _scale_rows(x_ptr, y_ptr, numel, BLOCK: tl.constexpr, PDL: tl.constexpr, TRIGGER: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if PDL:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()
    x = tl.load(x_ptr + offs, mask=offs < numel, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (x * 0.5 + 0.25).to(y_ptr.dtype.element_ty), mask=offs < numel)


def triton_op(x, y, pdl, trigger):
    numel = x.numel()
    _scale_rows[(triton.cdiv(numel, 2048),)](x, y, numel, BLOCK=2048, PDL=pdl, TRIGGER=trigger, num_warps=4,
                                              launch_pdl=pdl)
    return y


def graph_ms(fn, replays=40):
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), graph, out


def main():
    torch.manual_seed(0)
    dev = "cuda"
    M, H, I = 196, 1152, 4304
    blocks = []
    for _ in range(27):
        blocks.append({
            "qkv": (torch.randn(3 * H, H, device=dev, dtype=torch.bfloat16) * H**-0.5,
                    torch.randn(3 * H, device=dev, dtype=torch.bfloat16)),
            "proj": (torch.randn(H, H, device=dev, dtype=torch.bfloat16) * H**-0.5,
                     torch.randn(H, device=dev, dtype=torch.bfloat16)),
            "fc1": (torch.randn(I, H, device=dev, dtype=torch.bfloat16) * H**-0.5,
                    torch.randn(I, device=dev, dtype=torch.bfloat16)),
            "fc2": (torch.randn(H, I, device=dev, dtype=torch.bfloat16) * I**-0.5,
                    torch.randn(H, device=dev, dtype=torch.bfloat16)),
        })
    x0 = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    normed, qkv, roped, attn, proj = (torch.empty(M, n, device=dev, dtype=torch.bfloat16) for n in (H, 3 * H, 3 * H, H, H))
    h1, h2 = torch.empty(M, I, device=dev, dtype=torch.bfloat16), torch.empty(M, H, device=dev, dtype=torch.bfloat16)

    def tower(pdl, trigger, triton_ops=True):
        x = x0
        for w in blocks:
            if triton_ops:
                triton_op(x, normed, pdl, trigger)                       # add+norm
            torch.addmm(w["qkv"][1], normed, w["qkv"][0].t(), out=qkv)
            if triton_ops:
                triton_op(qkv, roped, pdl, trigger)                      # rotary
                triton_op(roped, qkv, pdl, trigger)  # attention stand-in
            torch.addmm(w["proj"][1], qkv[:, :H], w["proj"][0].t(), out=proj)
            if triton_ops:
                triton_op(proj, attn, pdl, trigger)                      # add+norm
            torch._addmm_activation(w["fc1"][1], attn, w["fc1"][0].t(), use_gelu=True, out=h1)
            torch.addmm(w["fc2"][1], h1, w["fc2"][0].t(), out=h2)
            x = h2
        return h2

    rows = []
    outs = {}
    fixed_input = torch.randn(M, H, device=dev, dtype=torch.bfloat16)
    for label, pdl, trigger, ops in (("cuBLAS only (no Triton kernels)", False, False, False),
                                     ("Triton kernels, plain launch", False, False, True),
                                     ("Triton kernels, PDL (wait first)", True, False, True),
                                     ("Triton kernels, PDL + trigger", True, True, True),
                                     ("Triton kernels, plain launch (again)", False, False, True),
                                     ("Triton kernels, PDL (wait first) (again)", True, False, True)):
        ms, graph, out = graph_ms(lambda pdl=pdl, trigger=trigger, ops=ops: tower(pdl, trigger, ops))
        x0.copy_(fixed_input)
        graph.replay()
        torch.cuda.synchronize()
        outs[label] = out.clone()
        rows.append((label, ms))
    print(torch.cuda.get_device_name(), torch.__version__, triton.__version__)
    print("\n| 27 blocks at 196 rows | graph ms |\n|---|---:|")
    for label, ms in rows:
        print(f"| {label} | {ms:.3f} |")
    base = outs["Triton kernels, plain launch"]
    print("\nPDL output bitwise equal to plain:", torch.equal(base, outs["Triton kernels, PDL (wait first)"]),
          torch.equal(base, outs["Triton kernels, PDL + trigger"]))


if __name__ == "__main__":
    main()
