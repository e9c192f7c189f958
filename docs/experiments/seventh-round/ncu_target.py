"""Launches at 1x12800 d72 for ncu, each kernel twice (the first compiles; profile with --launch-skip 1).

    ncu --clock-control none --kernel-name regex:_varlen_attn_fwd --launch-skip 1 --launch-count 5 \
        --metrics <list in README.md> python docs/experiments/seventh-round/ncu_target.py softmax   # run 2
    ... --launch-count 3 ... ncu_target.py tma                                                       # run 3
"""
import os, sys
import torch
sys.path.insert(0, os.path.dirname(__file__))
from attn_variants import inputs, launch, launch_tma, C  # noqa: E402
from rocm_vit.backends.triton_attn import triton_varlen_attention  # noqa: E402
q, k, v, cu = inputs([12800], 72); out = torch.empty_like(q)
for _ in range(2):
    triton_varlen_attention(q, k, v, cu, 12800, 72**-0.5, out=out); torch.cuda.synchronize()
if sys.argv[1] == "softmax":
    for flags in (dict(LAZY=8.0), dict(SUM_DOT=True)):
        launch(q, k, v, cu, 12800, out, C, flags); torch.cuda.synchronize()
        launch(q, k, v, cu, 12800, out, C, flags); torch.cuda.synchronize()
else:
    for _ in range(2):
        launch_tma(q, k, v, cu, 12800, out, C); torch.cuda.synchronize()
