"""Where the rotary inside triton_attn's launch pays: replayed device time, fused against triton_rope + triton_attn.

Each variant is captured as one CUDA/HIP graph of ``CALLS`` calls (launch gaps included, host cost
excluded) and replayed; the table gives microseconds per call at Qwen3-VL's shape (16 heads, head
dim 72, bf16, fused-qkv views, fp32 cos/sin), for segment lengths on both sides of
``FUSED_ROTARY_MAX_SEQLEN`` (the wrapper fuses any length it is given; the backend only up to the
bound). The fused call also saves one eager launch's host time, not counted here.

    PYTHONPATH=. python tests/gpu_fused_rotary_bench.py
"""

from __future__ import annotations

import sys

import torch

CALLS = 20
REPLAYS = 20
HEADS, HEAD_DIM = 16, 72
# name -> segment lengths: images, video frames, Qwen2.5-VL's windows, and longer single segments.
LAYOUTS = {
    "1x196": [196],
    "2x196": [196, 196],
    "16x196": [196] * 16,
    "64x64": [64] * 64,
    "1x256": [256],
    "1x400": [400],
    "1x576": [576],
    "1x1024": [1024],
    "1x2116": [2116],
}


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA or ROCm GPU", file=sys.stderr)
        return 2
    from rocm_vit.backends.triton_attn import FUSED_ROTARY_MAX_SEQLEN, triton_varlen_attention
    from rocm_vit.backends.triton_rope import triton_rotary_

    rows = []
    for name, lengths in LAYOUTS.items():
        unfused, fused = _calls(lengths, triton_rotary_, triton_varlen_attention)
        rows.append((name, max(lengths) <= FUSED_ROTARY_MAX_SEQLEN, _replayed_us(unfused), _replayed_us(fused)))
    print(f"{torch.cuda.get_device_name()}; {HEADS} heads, d{HEAD_DIM}, bf16; us per call, replayed")
    print("| layout | fused by the backend | rope + attn us | fused us | fused / two |")
    print("|---|---|---:|---:|---:|")
    for name, fuses, two, one in rows:
        print(f"| {name} | {'yes' if fuses else 'no'} | {two:.1f} | {one:.1f} | {one / two:.2f} |")
    return 0


def _calls(lengths: list[int], rotary, attention) -> tuple:
    """``(triton_rope then triton_attn, triton_attn rotating inside)`` on one layout's tensors."""
    device = torch.device("cuda")
    tokens = sum(lengths)
    q, k, v = torch.randn(tokens, 3, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16).unbind(1)
    # Real angles: the unfused calls rotate q and k again at every call, which keeps their norms.
    angles = torch.rand(tokens, HEAD_DIM // 2, device=device) * 40
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos(), angles.sin()
    offsets = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    longest, scale = max(lengths), HEAD_DIM**-0.5

    def unfused() -> None:
        rotary(q, k, cos, sin)
        attention(q, k, v, offsets, longest, scale, out=out)

    def fused() -> None:
        attention(q, k, v, offsets, longest, scale, out=out, cos=cos, sin=sin)

    return unfused, fused


def _replayed_us(call) -> float:
    """Microseconds per call of ``call`` replayed in a graph of ``CALLS`` calls (compiled before)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # compiles, outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            call()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / (REPLAYS * CALLS)


if __name__ == "__main__":
    sys.exit(main())
