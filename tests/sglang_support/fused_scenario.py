"""SGLang's Qwen3-VL tower under the plugin's fused blocks, in a process of its own; writes a JSON report.

Run by tests/test_sglang_fused_blocks.py as ``python fused_scenario.py REPORT.json`` with
``TRITON_INTERPRET=1``: rocm-vit's Triton kernels (add + LayerNorm, rotary) run interpreted on the CPU
under a GPU's policy, fused ops on, as a GPU would run them. For CUDA's decisions and ROCm's, fp32 and
bf16: the fused path's graphs (the stand-in mechanism) against its own eager calls under ``no_grad``
and ``inference_mode``; the fused path and SGLang's own eager blocks, each against transformers'
``Qwen3VLVisionModel`` with the same weights; the kernel calls of one forward; and
``ROCM_VIT_SGLANG_BLOCKS=sglang`` and an unrecognised block, which keep SGLang's blocks.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.append(str(HERE))
sys.path.append(str(HERE.parent))

import scenario  # noqa: E402
import torch  # noqa: E402
from env_vars import set_env  # noqa: E402
from toy_tower import tiny_qwen3_vl_config  # noqa: E402

# Three attention layouts: one image, an image and a two-frame video, another image. Small: the
# interpreter runs the add + norm kernel one row at a time (~7 ms a row, most of this scenario's time).
GRIDS = [[(1, 2, 4)], [(1, 2, 2), (2, 2, 2)], [(1, 4, 4)]]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    import sglang.srt.models.qwen3_vl  # noqa: F401

    scenario._init_sglang("cpu")
    import rocm_vit.integrations.sglang as plugin

    plugin.load()
    from sglang.srt.models import qwen3_vl  # noqa: F401  (its hooks land now)

    scenario._stand_in_aiter_kernel()
    generator = torch.Generator().manual_seed(0)
    hf = _transformers_model(generator)
    inputs = [(torch.randn(scenario._patches(grid), scenario.PATCH_DIM, generator=generator), grid) for grid in GRIDS]
    with torch.no_grad():
        reference = [_transformers_output(hf, pixels, grid) for pixels, grid in inputs]
    state = _sglang_state(hf.state_dict())
    report: dict[str, Any] = {}
    # ROCm's decisions differ from CUDA's in what the CPU cannot run (the GELU epilogue): bf16 only.
    for name, dtypes in (("cuda", ("fp32", "bf16")), ("rocm", ("bf16",))):
        report[name] = _under_policy(_facts()[name], dtypes, state, inputs, reference)
    report["qwen2_5_vl"] = _qwen2_5_vl(generator)
    report["gelu_epilogue"] = _gelu_epilogue_problems()
    report["sglang_setting"] = _sglang_blocks_kept(state, inputs, {"ROCM_VIT_SGLANG_BLOCKS": "sglang"})
    report["unrecognised"] = _sglang_blocks_kept(state, inputs, {}, unrecognised=True)
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))


def _facts() -> dict[str, Any]:
    from rocm_vit.policy import Facts

    return {
        "cuda": Facts("cuda", "sm_90", "stand-in", modules=frozenset({"triton"})),
        "rocm": Facts("rocm", "gfx950", "stand-in", modules=frozenset({"aiter", "triton"})),
    }


def _under_policy(
    facts: Any, dtypes: tuple[str, ...], state: dict, inputs: list, reference: list[torch.Tensor]
) -> dict[str, Any]:
    from rocm_vit import policy
    from rocm_vit.settings import Settings

    chosen = policy.resolve_policy(facts, Settings(attention_backend="sdpa"), None)
    result: dict[str, Any] = {"rotary": chosen.rotary.value, "fused_ops": chosen.fused_ops.value}
    with policy.use_policy(chosen):
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            model = scenario._tiny_model("cpu", dtype, attention="aiter_attn")
            model.load_weights((key, value.to(dtype)) for key, value in state.items())
            requests = [(pixels.to(dtype), grid) for pixels, grid in inputs]
            sglang_eager = scenario._run(model, requests, graphs=False)
            fused_eager, blocks = _adapter_outputs(model, requests, torch.no_grad, capacity=0)
            one = {"blocks": blocks, "kernels": _kernel_calls(model, requests[0])}
            for grad_mode in (torch.no_grad, torch.inference_mode):
                graphed, _ = _adapter_outputs(model, requests, grad_mode)
                one[f"graph_vs_eager_{grad_mode.__name__}"] = [
                    torch.equal(a, b) for a, b in zip(graphed, fused_eager + fused_eager, strict=True)
                ]
            one["fused_vs_sglang"] = _difference(fused_eager, sglang_eager)
            one["fused_vs_transformers"] = _difference(fused_eager, reference)
            one["sglang_vs_transformers"] = _difference(sglang_eager, reference)
            result[dtype_name] = one
    return result


def _qwen2_5_vl(generator: torch.Generator) -> dict[str, Any]:
    """SGLang's windowed Qwen2.5-VL tower (RMSNorm) under CUDA's policy: graphs against the fused eager
    calls, and the fused path against SGLang's eager blocks (its own RMSNorm rounds as transformers'
    does not: docs/numerics.md)."""
    from rocm_vit import policy
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter
    from rocm_vit.settings import Settings

    # Windows of 4 x 4 patches: two whole ones, then partial ones in both directions, then one.
    grids = [[(1, 4, 8)], [(1, 6, 6)], [(1, 4, 4)]]
    inputs = [(torch.randn(scenario._patches(g), scenario.PATCH_DIM, generator=generator), g) for g in grids]
    chosen = policy.resolve_policy(_facts()["cuda"], Settings(attention_backend="sdpa"), None)
    result: dict[str, Any] = {}
    with policy.use_policy(chosen):
        for dtype_name in ("fp32", "bf16"):
            model = scenario._tiny_qwen2_5_vl("cpu", attention="aiter_attn")
            scenario._randomise(model, torch.Generator().manual_seed(5))
            model.to(DTYPES[dtype_name])
            requests = [(pixels.to(DTYPES[dtype_name]), grid) for pixels, grid in inputs]
            sglang_eager = scenario._run_2_5(model, requests, graphs=False)
            outputs = {}
            # All eager once; graphs twice: each layout's first call captured, its second replayed.
            for name, capacity, calls in (("eager", "0", requests), ("graphs", "16", requests + requests)):
                with set_env({"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": capacity, "SGLANG_VIT_CUDA_GRAPH_PADDING": "0"}):
                    adapter = ViTGraphRunnerAdapter(model, mechanism=scenario._stand_in_mechanism())
                model.cuda_graph_runner = adapter
                outputs[name] = scenario._run_2_5(model, calls, graphs=True)
            twice = outputs["eager"] + outputs["eager"]
            result[dtype_name] = {
                "blocks": adapter.stats()["blocks"],
                "replays": adapter.stats()["replays"],
                "graph_vs_eager": [torch.equal(a, b) for a, b in zip(outputs["graphs"], twice, strict=True)],
                "fused_vs_sglang": _difference(outputs["eager"], sglang_eager),
            }
    return result


def _gelu_epilogue_problems() -> dict[str, Any]:
    """Which MLPs may take the tanh-GELU in fc1's GEMM (``gelu_epilogue_problem``): the toy Qwen3-VL
    tower's, then one changed at a time as a checkpoint or a server could change it, and Qwen2.5-VL's."""
    from rocm_vit.integrations.sglang.fused_blocks import FusedBlocks, gelu_epilogue_problem

    class Fp8LinearMethod:  # named as SGLang's, all that is read of it
        pass

    def erf_gelu(mlp: torch.nn.Module) -> None:
        mlp.act = torch.nn.GELU()

    def python_tanh_gelu(mlp: torch.nn.Module) -> None:
        mlp.act.act = mlp.act._gelu_tanh_python

    def quantized(mlp: torch.nn.Module) -> None:
        mlp.linear_fc1.quant_method = Fp8LinearMethod()

    def bias_returned(mlp: torch.nn.Module) -> None:
        mlp.linear_fc1.skip_bias_add = True

    model = scenario._tiny_model("cpu", attention="aiter_attn")
    result: dict[str, Any] = {
        "blocks_taking_it": sum(FusedBlocks(model)._gelu_in_fc1),
        "depth": len(model.blocks),
        "qwen3_vl": gelu_epilogue_problem(model.blocks[0].mlp),
    }
    for change in (erf_gelu, python_tanh_gelu, quantized, bias_returned):
        mlp = scenario._tiny_model("cpu", attention="aiter_attn").blocks[0].mlp
        change(mlp)
        result[change.__name__] = gelu_epilogue_problem(mlp)
    result["qwen2_5_vl"] = gelu_epilogue_problem(scenario._tiny_qwen2_5_vl("cpu").blocks[0].mlp)
    return result


def _adapter_outputs(
    model: torch.nn.Module, requests: list, grad_mode: Callable, capacity: int = 16
) -> tuple[list[torch.Tensor], str]:
    """The requests through SGLang's graph path and a fresh adapter: with ``capacity`` 0 once, all
    eager; else twice, the first call of a layout captured and the second replayed."""
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    environ = {"SGLANG_VIT_CUDA_GRAPH_CACHE_CAPACITY": str(capacity), "SGLANG_VIT_CUDA_GRAPH_PADDING": "0"}
    with set_env(environ):
        adapter = model.graph_runners = ViTGraphRunnerAdapter(model, mechanism=scenario._stand_in_mechanism())
    with grad_mode(), set_env({"SGLANG_VIT_ENABLE_CUDA_GRAPH": "1"}):
        calls = requests + requests if capacity else requests
        outputs = [model(pixels, torch.tensor(grid, dtype=torch.int32)) for pixels, grid in calls]
    stats = adapter.stats()
    if capacity:
        assert stats["replays"] == len(requests), stats
    return outputs, stats["blocks"]


def _kernel_calls(model: torch.nn.Module, request: tuple) -> dict[str, int]:
    """rocm-vit's add + norm kernels and torch's LayerNorm in one fused eager forward."""
    from rocm_vit.backends import triton_add_norm

    calls = {"add_norm": 0, "add_norm_with_add": 0, "layer_norm": 0}
    add_norm, layer_norm = triton_add_norm.add_norm, torch.nn.functional.layer_norm

    def counted_add_norm(x, update, *args):
        calls["add_norm"] += 1
        calls["add_norm_with_add"] += update is not None
        return add_norm(x, update, *args)

    def counted_layer_norm(*args, **kwargs):
        calls["layer_norm"] += 1
        return layer_norm(*args, **kwargs)

    triton_add_norm.add_norm, torch.nn.functional.layer_norm = counted_add_norm, counted_layer_norm
    try:
        _adapter_outputs(model, [request], torch.no_grad, capacity=0)
    finally:
        triton_add_norm.add_norm, torch.nn.functional.layer_norm = add_norm, layer_norm
    return calls


def _sglang_blocks_kept(state: dict, inputs: list, environ: dict[str, str], unrecognised: bool = False) -> dict:
    """Under CUDA's policy: graphs over SGLang's own blocks equal SGLang's eager forward bit for bit."""
    from rocm_vit import policy
    from rocm_vit.settings import Settings

    chosen = policy.resolve_policy(_facts()["cuda"], Settings(attention_backend="sdpa"), None)
    with policy.use_policy(chosen):
        model = scenario._tiny_model("cpu", attention="aiter_attn")
        model.load_weights(state.items())
        if unrecognised:  # SGLang's RMSNorm where its Qwen3-VL block has a LayerNorm
            from sglang.srt.layers.layernorm import RMSNorm

            model.blocks[2].norm2 = RMSNorm(model.blocks[2].norm2.normalized_shape[0])
        sglang_eager = scenario._run(model, inputs, graphs=False)
        with set_env(environ):
            graphed, blocks = _adapter_outputs(model, inputs, torch.no_grad)
    return {
        "blocks": blocks,
        "bitwise_equal": [torch.equal(a, b) for a, b in zip(graphed, sglang_eager + sglang_eager, strict=True)],
    }


def _difference(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> dict[str, float]:
    """Max and mean absolute difference over every output, and the max relative to the reference's largest value."""
    diff = torch.cat([(a.double() - b.double()).abs().flatten() for a, b in zip(outputs, reference, strict=True)])
    scale = max(float(b.double().abs().max()) for b in reference)
    return {"max_abs": float(diff.max()), "mean_abs": float(diff.mean()), "max_relative": float(diff.max()) / scale}


def _transformers_model(generator: torch.Generator) -> torch.nn.Module:
    """transformers' Qwen3-VL tower of the toy config, every weight random."""
    from transformers import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    toy = tiny_qwen3_vl_config()
    names = ("depth", "hidden_size", "intermediate_size", "num_heads", "out_hidden_size", "patch_size",
             "temporal_patch_size", "in_channels", "spatial_merge_size", "num_position_embeddings",
             "deepstack_visual_indexes", "hidden_act")  # fmt: skip
    config = Qwen3VLVisionConfig(**{name: getattr(toy, name) for name in names})
    config._attn_implementation = "sdpa"
    model = Qwen3VLVisionModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            values = torch.randn(parameter.shape, generator=generator) * 0.1
            parameter.copy_(values + 1.0 if "norm" in name and name.endswith("weight") else values)
    return model


def _transformers_output(model: torch.nn.Module, pixels: torch.Tensor, grid: list) -> torch.Tensor:
    out = model(pixels, torch.tensor(grid))
    return torch.cat([out.pooler_output, *out.deepstack_features], dim=1)


def _sglang_state(hf_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' names as SGLang's tower holds them (its loader's renaming of the fused qkv), for
    SGLang's own ``load_weights`` (which pads the position table's rows)."""
    return {name.replace(".attn.qkv.", ".attn.qkv_proj."): value for name, value in hf_state.items()}


if __name__ == "__main__":
    main()
