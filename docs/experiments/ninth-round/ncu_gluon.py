"""Launches of gluon_attn at 1x12800 d72 (tail split: main, split, merge) for Nsight Compute; the first
call compiles, so profile the second's with --launch-skip 2 (two _attn_fwd launches per call).

    M=sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,\
    sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__issue_active.avg.pct_of_peak_sustained_active,\
    sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,sm__cycles_elapsed.avg
    ncu --clock-control none --kernel-name regex:_attn_fwd --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
        --metrics $M,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
        python docs/experiments/ninth-round/ncu_gluon.py [tokens]
"""
import sys

import torch

from rocm_vit.backends.gluon_attn import gluon_varlen_attention

tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 12800
qkv = torch.randn(tokens, 3, 16, 72, device="cuda").to(torch.bfloat16)
q, k, v = qkv.unbind(1)
cu = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
for _ in range(2):
    gluon_varlen_attention(q, k, v, cu, tokens, 72**-0.5)
    torch.cuda.synchronize()
