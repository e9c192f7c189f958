#!/usr/bin/env bash
# AMD Instinct tier (`make rocm-test`): gpu- and rocm-marked tests with SGLANG_USE_AITER=1, then
# `rocm-vit verify` under inference_mode (as serving runs; also --padded) and under no_grad, the towers,
# the runner and `verify` again with the compiled rotary (ROCM_VIT_ROTARY=compiled, a tune choice), then
# `rocm-vit report --quick` into build/rocm-vit-report-<time> (ROCM_VIT_REPORT_DIR), whose report.md
# a first MI355X user attaches to an issue. The report runs last even when a step before it failed
# (that is when it is needed most) and prints its path; the tier's status is the first failure's.
#
# Needs the image's ROCm torch and an importable aiter; never installs torch or triton (they would
# replace the image's builds). Fails, saying why, on a machine without them. Needs no network. The
# CPU suite is `make test`; docs/rocm.md says what each step proves.
set -euo pipefail
source "$(dirname "$0")/common.sh"
# What runs a tower, the runner or SGLang's towers end to end under the rotary in force
# (tests/gpu/test_rotary_gpu.py names each rotary itself).
COMPILED_ROTARY_TESTS=(tests/gpu/test_graphs_gpu.py tests/gpu/test_serving_loop_gpu.py tests/gpu/test_sglang_gpu.py)
export SGLANG_USE_AITER=1
unset ROCM_VIT_EMULATE

choose_gpu_python rocm
install_sglang_wheelhouse
report_dir=${ROCM_VIT_REPORT_DIR:-$ROOT/build/rocm-vit-report-$(date +%Y%m%d-%H%M%S)}
_report_on_exit() {
  local status=$? report_status=0
  trap - EXIT
  echo "== rocm-vit report --quick"
  "$PY" -m rocm_vit report --quick --out "$report_dir" || report_status=$?
  echo "== report: $report_dir/report.md (please attach it to your issue: docs/rocm.md, \"First run on an MI355X\")"
  if [ "$status" != 0 ]; then exit "$status"; fi
  exit "$report_status"
}
trap _report_on_exit EXIT
# Importing aiter runs rocminfo and loads its modules: fine here, on the machine it is meant for.
aiter_error=$("$PY" -c 'import aiter' 2>&1 | tail -n 1) ||
  die "aiter is not importable in $PY ($aiter_error): install AMD's aiter (pip install 'rocm-vit[aiter]', or the ROCm image's build)"

# The fast launch's key against this image's own Triton binder (a CPU test the GPU tests rely on).
REQUIRE_EXECUTED=1 run_pytest tests/test_fast_launch.py
REQUIRE_EXECUTED=1 run_pytest -m "gpu or rocm" tests
run_verify --grad-mode inference
run_verify --grad-mode inference --padded
run_verify --grad-mode no_grad

echo "== the compiled rotary (ROCM_VIT_ROTARY=compiled)"
(
  export ROCM_VIT_ROTARY=compiled
  REQUIRE_EXECUTED=1 run_pytest -m "gpu or rocm" "${COMPILED_ROTARY_TESTS[@]}"
  run_verify --grad-mode inference
  run_verify --grad-mode no_grad
)
