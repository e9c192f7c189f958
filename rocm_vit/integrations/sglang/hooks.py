"""What the plugin changes in SGLang, and the version gate that decides whether each change is safe.

Invariant: on an untested SGLang release a hook whose targets are missing or differ is left out with one
warning; the others still apply. docs/sglang.md lists them.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType

from rocm_vit.integrations.sglang.imports import replace_attribute

# SGLang releases whose source the hooks were written against and tested with (tests/test_sglang_plugin.py).
TESTED_SGLANG_VERSIONS = ("0.5.23",)

_VISION = "sglang.srt.layers.attention.vision"
_RUNNER = "sglang.srt.multimodal.vit_cuda_graph_runner"
_QWEN3_VL = "sglang.srt.models.qwen3_vl"
_QWEN2_5_VL = "sglang.srt.models.qwen2_5_vl"
_ENCODER_SERVER = "sglang.srt.disaggregation.encoder.server"
_ENCODER_RUNTIME = "sglang.srt.disaggregation.encoder.runtime"
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner"


@dataclass(frozen=True)
class Hook:
    """One change to one SGLang module; ``signatures``: attribute path -> expected parameters (None: exists)."""

    name: str
    module: str
    targets: tuple[str, ...]
    signatures: Mapping[str, tuple[str, ...] | None]
    install: Callable[[ModuleType], None]

    def mismatch(self, module: ModuleType) -> str | None:
        """Why this hook does not fit ``module`` (a missing target, other parameters), or ``None``."""
        for path, expected in self.signatures.items():
            target: object = module
            for part in path.split("."):
                if not hasattr(target, part):
                    return f"{self.module}.{path} does not exist"
                target = getattr(target, part)
            if expected is None:
                continue
            try:
                found = tuple(inspect.signature(target).parameters)
            except (TypeError, ValueError):
                return f"{self.module}.{path} has no inspectable signature"
            if found != expected:
                return f"{self.module}.{path} takes ({', '.join(found)}), rocm-vit expects ({', '.join(expected)})"
        return None


def sglang_version() -> str | None:
    """The installed SGLang release, from its metadata (no import); ``None`` when unknown."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def is_tested(version: str | None) -> bool:
    """Whether the hooks were tested on ``version``; any other release gets each target checked."""
    return version in TESTED_SGLANG_VERSIONS


def _install_aiter_attention(vision: ModuleType) -> None:
    from rocm_vit.integrations.sglang.attention import AiterVisionAttention

    # replace_attribute rebinds QKV_BACKEND_IMPL's "aiter_attn" entry too.
    replace_attribute(vision, "VisionAiterAttention", AiterVisionAttention)


def _install_rotary(vision: ModuleType) -> None:
    from rocm_vit.integrations.sglang.attention import rotary_pos_emb

    # Both become rocm-vit's so eager and graph mode agree; in vision.py only (the LM rotary keeps SGLang's).
    replace_attribute(vision, "apply_rotary_pos_emb", rotary_pos_emb, rebind=False)
    replace_attribute(vision, "apply_rotary_pos_emb_native_eager", rotary_pos_emb, rebind=False)


def _install_graph_runner(runner_module: ModuleType) -> None:
    from rocm_vit.integrations.sglang.graph_runner import ViTGraphRunnerAdapter

    replace_attribute(runner_module, "ViTCudaGraphRunner", ViTGraphRunnerAdapter)


def _install_qwen3_vl_interpolation(qwen3_vl: ModuleType) -> None:
    from rocm_vit.integrations.sglang.qwen3_vl import fast_pos_embed_interpolate

    replace_attribute(qwen3_vl.Qwen3VLMoeVisionModel, "fast_pos_embed_interpolate", fast_pos_embed_interpolate)


def _install_qwen3_vl_prepare(qwen3_vl: ModuleType) -> None:
    from rocm_vit.integrations.sglang.prepare import prepare_graph_inputs_from_cache

    tower = qwen3_vl.Qwen3VLMoeVisionModel
    replace_attribute(tower, "_prepare_graph_inputs", prepare_graph_inputs_from_cache(tower._prepare_graph_inputs))


def _install_qwen3_vl_graph_forward(qwen3_vl: ModuleType) -> None:
    from rocm_vit.integrations.sglang.prepare import forward_with_cuda_graph_from_cache

    tower = qwen3_vl.Qwen3VLMoeVisionModel
    replace_attribute(
        tower, "forward_with_cuda_graph", forward_with_cuda_graph_from_cache(tower.forward_with_cuda_graph)
    )


def _install_qwen2_5_vl_graph_forward(qwen2_5_vl: ModuleType) -> None:
    from rocm_vit.integrations.sglang.prepare_windows import forward_with_cuda_graph_from_cache

    tower = qwen2_5_vl.Qwen2_5_VisionTransformer
    hooked = forward_with_cuda_graph_from_cache(tower.forward_with_cuda_graph, qwen2_5_vl.permute_inv)
    replace_attribute(tower, "forward_with_cuda_graph", hooked)


def _install_qwen2_5_vl_graph_gate(qwen2_5_vl: ModuleType) -> None:
    from rocm_vit.integrations.sglang.qwen2_5_vl import lift_graph_gate

    tower = qwen2_5_vl.Qwen2_5_VisionTransformer
    replace_attribute(tower, "__init__", lift_graph_gate(tower.__init__))


def _install_bucket_captures(model_runner: ModuleType) -> None:
    from rocm_vit.integrations.sglang.startup import capture_buckets_after, model_runner_model

    runner_class = model_runner.ModelRunner
    hooked = capture_buckets_after(runner_class.init_cuda_graphs, model_runner_model)
    replace_attribute(runner_class, "init_cuda_graphs", hooked)


def _install_encoder_bucket_captures(server: ModuleType) -> None:
    from rocm_vit.integrations.sglang.startup import capture_buckets_after, loaded_model

    name = "maybe_precompile_model_kernels_after_loading"
    # Not rebound: ModelRunner calls the same function before the KV cache is sized, and captures its
    # buckets later, at init_cuda_graphs.
    replace_attribute(server, name, capture_buckets_after(getattr(server, name), loaded_model), rebind=False)


def _install_tp_worker(server: ModuleType) -> None:
    from rocm_vit.integrations.sglang import workers

    replace_attribute(server, "launch_encoder", workers.launch_encoder)


def _install_dp_worker(runtime: ModuleType) -> None:
    from rocm_vit.integrations.sglang import workers

    replace_attribute(runtime, "launch_dp_worker", workers.launch_dp_worker)


_BACKEND_FORWARD = (
    "self",
    "q",
    "k",
    "v",
    "cu_seqlens",
    "bsz",
    "seq_len",
    "softmax_scale",
    "forward_metadata",
    "kwargs",
)
_ROTARY = ("q", "k", "cos", "sin", "unsqueeze_dim")
_RUNNER_RUN = (
    "self",
    "x",
    "cu_seqlens",
    "cu_window_seqlens",
    "position_embeddings",
    "rotary_pos_emb_cos",
    "rotary_pos_emb_sin",
    "output_indices",
    "attention_layout_key",
)

HOOKS: tuple[Hook, ...] = (
    Hook(
        name="aiter_attn",
        module=_VISION,
        targets=(f"{_VISION}.VisionAiterAttention", f"{_VISION}.QKV_BACKEND_IMPL['aiter_attn']"),
        signatures={
            "VisionAiterAttention.__init__": ("self", "kwargs"),
            "VisionAiterAttention.forward": _BACKEND_FORWARD,
            "QKV_BACKEND_IMPL": None,
        },
        install=_install_aiter_attention,
    ),
    Hook(
        name="rotary",
        module=_VISION,
        targets=(f"{_VISION}.apply_rotary_pos_emb", f"{_VISION}.apply_rotary_pos_emb_native_eager"),
        signatures={"apply_rotary_pos_emb": _ROTARY, "apply_rotary_pos_emb_native_eager": _ROTARY},
        install=_install_rotary,
    ),
    Hook(
        name="graph_runner",
        module=_RUNNER,
        targets=(
            f"{_RUNNER}.ViTCudaGraphRunner",
            f"{_QWEN3_VL}.ViTCudaGraphRunner",
            f"{_QWEN2_5_VL}.ViTCudaGraphRunner",
        ),
        signatures={
            "ViTCudaGraphRunner.__init__": ("self", "vit"),
            "ViTCudaGraphRunner.run": _RUNNER_RUN,
        },
        install=_install_graph_runner,
    ),
    Hook(
        name="qwen3_vl_graph_interpolation",
        module=_QWEN3_VL,
        targets=(f"{_QWEN3_VL}.Qwen3VLMoeVisionModel.fast_pos_embed_interpolate",),
        signatures={
            "Qwen3VLMoeVisionModel.fast_pos_embed_interpolate": ("self", "grid_thw"),
            "Qwen3VLMoeVisionModel.fast_pos_embed_interpolate_from_list": ("self", "grid_thw"),
            "Qwen3VLMoeVisionModel.fast_pos_embed_interpolate_vectorized": ("self", "grid_thw"),
            "Qwen3VLMoeVisionModel._use_vectorized_pos_embed": ("self", "num_images"),
        },
        install=_install_qwen3_vl_interpolation,
    ),
    Hook(
        name="qwen3_vl_prepare_from_cache",
        module=_QWEN3_VL,
        targets=(f"{_QWEN3_VL}.Qwen3VLMoeVisionModel._prepare_graph_inputs",),
        signatures={
            "Qwen3VLMoeVisionModel._prepare_graph_inputs": ("self", "x", "grid_thw"),
            "Qwen3VLMoeVisionModel.forward_with_cuda_graph": ("self", "x", "grid_thw"),
            "Qwen3VLMoeVisionModel.rot_pos_emb": ("self", "grid_thw"),
            "Qwen3VLMoeVisionModel.fast_pos_embed_interpolate_from_list": ("self", "grid_thw"),
        },
        install=_install_qwen3_vl_prepare,
    ),
    Hook(
        name="qwen3_vl_graph_forward_from_cache",
        module=_QWEN3_VL,
        targets=(f"{_QWEN3_VL}.Qwen3VLMoeVisionModel.forward_with_cuda_graph",),
        signatures={
            "Qwen3VLMoeVisionModel.forward_with_cuda_graph": ("self", "x", "grid_thw"),
            "Qwen3VLMoeVisionModel._prepare_graph_inputs": ("self", "x", "grid_thw"),
            "Qwen3VLMoeVisionModel.rot_pos_emb": ("self", "grid_thw"),
            "Qwen3VLMoeVisionModel.fast_pos_embed_interpolate_from_list": ("self", "grid_thw"),
            # The runner it calls with SGLang's keywords (SGLang's class, or rocm-vit's adapter once applied).
            "ViTCudaGraphRunner.run": _RUNNER_RUN,
        },
        install=_install_qwen3_vl_graph_forward,
    ),
    Hook(
        name="qwen2_5_vl_graph_gate",
        module=_QWEN2_5_VL,
        targets=(f"{_QWEN2_5_VL}.Qwen2_5_VisionTransformer.__init__",),
        signatures={
            "Qwen2_5_VisionTransformer.__init__": (
                "self",
                "vision_config",
                "norm_eps",
                "quant_config",
                "prefix",
                "use_data_parallel",
                "max_context_len",
            ),
            "Qwen2_5_VisionTransformer.forward_with_cuda_graph": ("self", "x", "grid_thw"),
            "ViTCudaGraphRunner": None,
            "envs.SGLANG_VIT_ENABLE_CUDA_GRAPH": None,
        },
        install=_install_qwen2_5_vl_graph_gate,
    ),
    Hook(
        name="qwen2_5_vl_graph_forward_from_cache",
        module=_QWEN2_5_VL,
        targets=(f"{_QWEN2_5_VL}.Qwen2_5_VisionTransformer.forward_with_cuda_graph",),
        signatures={
            "Qwen2_5_VisionTransformer.forward_with_cuda_graph": ("self", "x", "grid_thw"),
            "Qwen2_5_VisionTransformer.rot_pos_emb": ("self", "grid_thw"),
            "Qwen2_5_VisionTransformer.get_window_index": ("self", "grid_thw"),
            "permute_inv": ("perm",),
            "ViTCudaGraphRunner.run": _RUNNER_RUN,
        },
        install=_install_qwen2_5_vl_graph_forward,
    ),
    Hook(
        name="vit_buckets_at_start",
        module=_MODEL_RUNNER,
        targets=(f"{_MODEL_RUNNER}.ModelRunner.init_cuda_graphs",),
        signatures={"ModelRunner.init_cuda_graphs": ("self", "capture_decode_cuda_graph")},
        install=_install_bucket_captures,
    ),
    Hook(
        name="encoder_buckets_at_start",
        module=_ENCODER_SERVER,
        targets=(f"{_ENCODER_SERVER}.maybe_precompile_model_kernels_after_loading",),
        signatures={"maybe_precompile_model_kernels_after_loading": ("model", "device"), "MMEncoder": None},
        install=_install_encoder_bucket_captures,
    ),
    Hook(
        name="encoder_tp_worker",
        module=_ENCODER_SERVER,
        targets=(f"{_ENCODER_SERVER}.launch_encoder", f"{_ENCODER_RUNTIME}.launch_encoder"),
        signatures={"launch_encoder": ("server_args", "schedule_path", "dist_init_method", "rank")},
        install=_install_tp_worker,
    ),
    Hook(
        name="encoder_dp_worker",
        module=_ENCODER_RUNTIME,
        targets=(f"{_ENCODER_RUNTIME}.launch_dp_worker",),
        signatures={
            "launch_dp_worker": ("server_args", "dp_rank", "gpu_id", "dispatch_path", "release_path", "result_path")
        },
        install=_install_dp_worker,
    ),
)
