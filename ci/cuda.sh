#!/usr/bin/env bash
# NVIDIA tier (`make gpu-test`): the gpu-marked tests and `rocm-vit verify` (under inference_mode, also
# --padded, and under no_grad), then all of it again emulating ROCm (ROCM_VIT_EMULATE=rocm): every decision an
# MI355X takes (the Triton rotary, HIP tiles, aiter_attn through aiter's stand-in), on this GPU; then, still
# emulating ROCm, the towers, the runner and `rocm-vit verify` with the compiled rotary (a tune or
# ROCM_VIT_ROTARY choice there).
#
# Needs a CUDA torch that sees a GPU; uses the first python that has one (see ci/common.sh) and
# fails, saying why, on a machine without one. The CPU suite is `make test`.
set -euo pipefail
source "$(dirname "$0")/common.sh"
# What runs a tower, the runner or SGLang's towers end to end under the rotary in force
# (tests/gpu/test_rotary_gpu.py names each rotary itself).
COMPILED_ROTARY_TESTS=(tests/gpu/test_graphs_gpu.py tests/gpu/test_serving_loop_gpu.py tests/gpu/test_sglang_gpu.py)

choose_gpu_python cuda
install_sglang_wheelhouse
# The fast launch's key against this image's own Triton binder (a CPU test the GPU tests rely on).
REQUIRE_EXECUTED=1 run_pytest tests/test_fast_launch.py
echo "== native CUDA"
REQUIRE_EXECUTED=1 run_pytest -m "gpu and not rocm" tests
run_verify --grad-mode inference
run_verify --grad-mode inference --padded
run_verify --grad-mode no_grad

echo "== emulating ROCm (ROCM_VIT_EMULATE=rocm, gfx950 decisions on this GPU)"
export ROCM_VIT_EMULATE=rocm SGLANG_USE_AITER=1
REQUIRE_EXECUTED=1 run_pytest -m "gpu or rocm" tests
run_verify --grad-mode inference
run_verify --grad-mode inference --padded
run_verify --grad-mode no_grad

echo "== emulating ROCm with the compiled rotary (ROCM_VIT_ROTARY=compiled)"
(
  export ROCM_VIT_ROTARY=compiled
  REQUIRE_EXECUTED=1 run_pytest -m "gpu or rocm" "${COMPILED_ROTARY_TESTS[@]}"
  run_verify --grad-mode inference
  run_verify --grad-mode no_grad
)
