#!/usr/bin/env bash
# AMD Instinct tier (`make rocm-test`): gpu- and rocm-marked tests with SGLANG_USE_AITER=1, then
# `rocm-vit verify` under inference_mode (as serving runs) and under no_grad.
#
# Needs the image's ROCm torch and an importable aiter; never installs torch or triton (they would
# replace the image's builds). Fails, saying why, on a machine without them. Needs no network. The
# CPU suite is `make test`; docs/rocm.md says what each step proves.
set -euo pipefail
source "$(dirname "$0")/common.sh"
export SGLANG_USE_AITER=1
unset ROCM_VIT_EMULATE

choose_gpu_python rocm
# Importing aiter runs rocminfo and loads its modules: fine here, on the machine it is meant for.
aiter_error=$("$PY" -c 'import aiter' 2>&1 | tail -n 1) ||
  die "aiter is not importable in $PY ($aiter_error): install AMD's aiter (pip install 'rocm-vit[aiter]', or the ROCm image's build)"

REQUIRE_EXECUTED=1 run_pytest -m "gpu or rocm" tests
run_verify --grad-mode inference
run_verify --grad-mode no_grad
