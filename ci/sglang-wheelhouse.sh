#!/usr/bin/env bash
# Make the SGLang wheelhouse for GPU machines that reach no package index (docs/install.md, "SGLang
# without a package index"): SGLang 0.5.23 and what importing its Qwen3-VL vision tower needs, as
# CPython 3.12 manylinux/any wheels, into DIR (default .sglang-wheels). Run on a machine with an
# index; carry DIR to the GPU machine and run `SGLANG_WHEELHOUSE=DIR make gpu-test` (or ci/cuda.sh).
#
# The list: ci/requirements-sglang.txt (SGLang and the pins its import needs) and
# ci/requirements-sglang-gpu.txt (what the offline CUDA image of the GPU tiers lacks beyond them), less the
# distributions named in SKIP (default: those that image already has, docs/install.md),
# which ci/common.sh's install_sglang_wheelhouse would not install over the image's anyway.
# No wheel of torch, triton or sglang-kernel is ever downloaded: the GPU image's own builds stay.
#
#   ci/sglang-wheelhouse.sh [DIR]     PYTHON_VERSION (default 3.12)    SKIP (space-separated names)
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${1:-.sglang-wheels}
PYTHON_VERSION=${PYTHON_VERSION:-3.12}
# Already in the offline CUDA image of the GPU tiers (torch 2.11.0+cu130, transformers 5.17.0).
SKIP=${SKIP:-aiohappyeyeballs aiohttp aiosignal attrs certifi einops frozenlist httpx multidict pillow propcache psutil requests sentencepiece urllib3 yarl}
PY=${PY:-python3}

requirements=$(mktemp)
trap 'rm -f "$requirements"' EXIT
"$PY" - "$SKIP" ci/requirements-sglang.txt ci/requirements-sglang-gpu.txt >"$requirements" <<'PY'
import re
import sys

skip = {re.sub(r"[-_.]+", "-", name).lower() for name in sys.argv[1].split()}
never = {"torch", "triton", "sglang-kernel", "sgl-kernel"}
for path in sys.argv[2:]:
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name = re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[; ]", line, maxsplit=1)[0]).lower()
        if name in never:
            sys.exit(f"{path}: {line}: the wheelhouse never carries {name} (the GPU image's build stays)")
        if name not in skip:
            print(line)
PY
mkdir -p "$DIR"
echo "sglang-wheelhouse: $(wc -l <"$requirements") wheels for CPython $PYTHON_VERSION into $DIR"
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYTHON_VERSION" --implementation cp \
  --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any \
  -r "$requirements" -d "$DIR"
echo "sglang-wheelhouse: $(find "$DIR" -name '*.whl' | wc -l) wheels, $(du -sh "$DIR" | cut -f1) in $DIR"
