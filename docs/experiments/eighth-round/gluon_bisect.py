"""The one-line difference that cost the shipped Gluon kernel 20 %: where program_id(0) is read.

Writes a copy of rocm_vit/backends/gluon_attn.py that reads program_id(0) after the cu_seqlens loads
(as the first version did), imports both, and times them on the same inputs (H200, Triton 3.6).
    PYTHONPATH=$PWD python docs/experiments/eighth-round/gluon_bisect.py
"""
import importlib.util, pathlib, sys, tempfile
import torch, triton
from rocm_vit.backends import gluon_attn as shipped

source = pathlib.Path(shipped.__file__).read_text()
fast = """    row_start = gl.program_id(0) * (2 * ROWS)
    head = gl.program_id(1)
    seq = gl.program_id(2)
    seq_row0 = gl.load(cu_seqlens + seq)
    seq_len = gl.load(cu_seqlens + seq + 1) - seq_row0
"""
slow = """    head = gl.program_id(1)
    seq = gl.program_id(2)
    seq_row0 = gl.load(cu_seqlens + seq)
    seq_len = gl.load(cu_seqlens + seq + 1) - seq_row0
    row_start = gl.program_id(0) * (2 * ROWS)
"""
assert fast in source
variant = source.replace(fast, slow)
for name in ("launch_math", "triton_attn", "varlen_args"):
    variant = variant.replace(f"from .{name} import", f"from rocm_vit.backends.{name} import")
path = pathlib.Path(tempfile.mkdtemp()) / "gluon_attn_late_pid.py"
path.write_text(variant)
spec = importlib.util.spec_from_file_location("gluon_attn_late_pid", path)
late = importlib.util.module_from_spec(spec)
sys.modules["gluon_attn_late_pid"] = late
spec.loader.exec_module(late)

dev = torch.device("cuda")
T = 12800
q, k, v = torch.randn((T, 3, 16, 72), device=dev, dtype=torch.bfloat16).unbind(1)
cu = torch.tensor([0, T], dtype=torch.int32, device=dev)
cases = {"program_id(0) first (shipped)": shipped, "program_id(0) after the loads": late}
outs = {n: m.gluon_varlen_attention(q, k, v, cu, T, 72 ** -0.5) for n, m in cases.items()}
print("bitwise equal:", torch.equal(*outs.values()))
for n, m in list(cases.items()) * 2:
    ms = triton.testing.do_bench(lambda: m.gluon_varlen_attention(q, k, v, cu, T, 72 ** -0.5), warmup=10, rep=100,
                                 return_mode="median")
    print(f"{n:32s} {ms:.3f} ms")
