#!/usr/bin/env bash
# NVIDIA tier (`make gpu-test`): the gpu-marked tests, then `rocm-vit verify`.
#
# Needs a CUDA torch that sees a GPU; uses the first python that has one (see ci/common.sh) and
# fails, saying why, on a machine without one. The CPU suite is `make test`.
set -euo pipefail
source "$(dirname "$0")/common.sh"

choose_gpu_python cuda
REQUIRE_EXECUTED=1 run_pytest -m "gpu and not rocm" tests
run_verify
