# Helpers sourced by ci/cpu.sh, ci/cuda.sh and ci/rocm.sh. Not executable on its own.
#
# GPU tiers never install torch or triton over an image's own build: they run the first python
# that already has a GPU torch (the image's python3, then .venv), with the checkout on PYTHONPATH,
# so an offline image with torch and pytest preinstalled runs as-is. Only when no interpreter has
# pytest, or (NVIDIA, GPU present) none has a CUDA torch, is .venv made (ci/venv.sh).

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
VENV=${VENV:-.venv}
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

die() {
  echo "$*" >&2
  exit 1
}

# Prints what torch build "$1" has; exit 0 when it is a "$2" (cuda|rocm) build that sees a GPU.
_gpu_torch() {
  "$1" - "$2" 2>&1 <<'PY'
import sys

kind = sys.argv[1]
try:
    import torch
except Exception as err:  # noqa: BLE001 - any import failure means "no usable torch"
    sys.exit(f"cannot import torch: {err}")
build = f"torch {torch.__version__} (hip={torch.version.hip}, cuda={torch.version.cuda})"
if kind == "rocm" and not torch.version.hip:
    sys.exit(f"{build} is not a ROCm build")
if kind == "cuda" and not torch.version.cuda:
    sys.exit(f"{build} is not a CUDA build" + (": use make rocm-test" if torch.version.hip else ""))
if not torch.cuda.is_available():
    sys.exit(f"{build} sees no GPU (torch.cuda.is_available() is False)")
print(f"{build}, {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}")
PY
}

_has_pytest() {
  "$1" -c 'import pytest' >/dev/null 2>&1
}

# Sets PY to an interpreter whose torch is a "$1" (cuda|rocm) build seeing a GPU and that has
# pytest; explains and exits non-zero when there is none.
choose_gpu_python() {
  local kind=$1 candidate found report venv_py="$ROOT/$VENV/bin/python" with_torch="" candidates=()
  [[ $VENV = /* ]] && venv_py="$VENV/bin/python"
  if [ -n "${PYTHON:-}" ]; then
    candidates=("$PYTHON")
  else
    command -v python3 >/dev/null 2>&1 && candidates+=("$(command -v python3)")
    [ -x "$venv_py" ] && candidates+=("$venv_py")
  fi
  report=""
  for candidate in "${candidates[@]}"; do
    if found=$(_gpu_torch "$candidate" "$kind"); then
      if _has_pytest "$candidate"; then
        PY=$candidate
        echo "== $kind tier: $PY: $found"
        return 0
      fi
      report+="  $candidate: $found, but pytest is not installed"$'\n'
      [ -z "$with_torch" ] && with_torch=$candidate
    else
      report+="  $candidate: $found"$'\n'
    fi
  done
  if [ ! -e "$venv_py" ]; then
    if [ -n "$with_torch" ]; then
      echo "== $with_torch has a $kind torch but no pytest: creating $VENV on top of it"
      PYTHON="$with_torch" ci/venv.sh
    elif [ -z "${PYTHON:-}" ] && [ "$kind" = cuda ] && _nvidia_gpu_present; then
      echo "== no python with a CUDA torch: creating $VENV (${TORCH_SPEC:-torch==2.13.0})"
      ci/venv.sh
    fi
    if [ -x "$venv_py" ] && found=$(_gpu_torch "$venv_py" "$kind") && _has_pytest "$venv_py"; then
      PY=$venv_py
      echo "== $kind tier: $PY: $found"
      return 0
    fi
  fi
  report=${report%$'\n'}
  die "make ${kind/cuda/gpu}-test needs a python with a $kind torch that sees a GPU, and pytest. Found:"$'\n'"${report:-  no python3 on PATH}"$'\n'"$(_gpu_hint "$kind")"
}

_nvidia_gpu_present() {
  [ -e /dev/nvidiactl ] || command -v nvidia-smi >/dev/null 2>&1
}

_gpu_hint() {
  if [ "$1" = rocm ]; then
    [ -e /dev/kfd ] || echo "No AMD GPU is visible (/dev/kfd is missing)."
    echo "Run inside a ROCm image whose python has the ROCm torch (and aiter), or pass PYTHON=/path/to/python."
    echo "rocm-vit never installs torch or triton on ROCm: they would replace the image's builds."
  else
    _nvidia_gpu_present || echo "No NVIDIA GPU is visible (no /dev/nvidiactl, no nvidia-smi)."
    echo "Use a python with a CUDA torch (pip install torch) or pass PYTHON=/path/to/python."
  fi
}

# Runs pytest with "$@"; fails when it fails, when it collects nothing (exit 5), and, with
# REQUIRE_EXECUTED=1, when every selected test was skipped (a GPU tier must not pass on skips).
run_pytest() {
  local junit="" rc=0
  if [ "${REQUIRE_EXECUTED:-0}" = 1 ]; then
    junit=$(mktemp)
    set -- --junitxml="$junit" "$@"
  fi
  "$PY" -m pytest --durations=10 "$@" || rc=$?
  if [ "$rc" = 5 ]; then
    rm -f "$junit"
    die "pytest collected no tests for: $* (exit 5); an empty tier is a failure"
  fi
  if [ "$rc" != 0 ]; then
    rm -f "$junit"
    exit "$rc"
  fi
  if [ -n "$junit" ]; then
    "$PY" - "$junit" <<'PY' || rc=$?
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
tests = sum(int(s.get("tests", 0)) for s in suites)
skipped = sum(int(s.get("skipped", 0)) for s in suites)
if tests - skipped <= 0:
    sys.exit(f"all {tests} selected tests were skipped: this tier did not test anything")
PY
  fi
  rm -f "$junit"
  [ "$rc" = 0 ] || exit "$rc"
}

# With SGLANG_WHEELHOUSE=DIR (made by ci/sglang-wheelhouse.sh), installs SGLang into "$PY" from DIR
# when "$PY" lacks it: offline (--no-index), one wheel at a time as given (--no-deps), only the
# distributions "$PY" lacks or has at an older version (pydantic-core needs a newer typing-extensions
# than some images have), never torch, triton, sglang-kernel or NVIDIA's libraries (the image's
# builds stay). The SGLang GPU tests then fail, not skip, where SGLang cannot be imported.
install_sglang_wheelhouse() {
  local wheels=()
  [ -n "${SGLANG_WHEELHOUSE:-}" ] || return 0
  [ -d "$SGLANG_WHEELHOUSE" ] || die "SGLANG_WHEELHOUSE=$SGLANG_WHEELHOUSE is not a directory (make it with ci/sglang-wheelhouse.sh)"
  export SGLANG_WHEELHOUSE
  if "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("sglang") is None)'; then
    echo "== SGLang: $PY has it already; $SGLANG_WHEELHOUSE is not used"
    return 0
  fi
  mapfile -t wheels < <("$PY" - "$SGLANG_WHEELHOUSE" <<'PY'
import importlib.metadata as md
import re
import sys
from pathlib import Path

try:
    from packaging.version import InvalidVersion, Version
except ImportError:
    from pip._vendor.packaging.version import InvalidVersion, Version

NEVER = ("torch", "triton", "pytorch-triton", "sglang-kernel", "sgl-kernel", "nvidia-")
for wheel in sorted(Path(sys.argv[1]).glob("*.whl")):
    name, version = wheel.name.split("-")[:2]
    name = re.sub(r"[-_.]+", "-", name).lower()
    if name in NEVER[:-1] or name.startswith(NEVER[-1]):
        continue
    try:
        installed = md.version(name)
    except md.PackageNotFoundError:
        print(wheel)
        continue
    try:
        if Version(installed) < Version(version):
            print(wheel)
    except InvalidVersion:
        pass  # a local build the wheelhouse cannot judge: it stays
PY
  )
  printf '%s\n' "${wheels[@]}" | grep -q '/sglang-[^/]*\.whl$' ||
    die "SGLANG_WHEELHOUSE=$SGLANG_WHEELHOUSE holds no sglang wheel to install (make it with ci/sglang-wheelhouse.sh)"
  echo "== SGLang: installing ${#wheels[@]} wheels from $SGLANG_WHEELHOUSE into $PY (--no-index --no-deps)"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps "${wheels[@]}"
}

# Runs `rocm-vit verify` when the subcommand exists (it grows with the graph-runner work).
run_verify() {
  if ! "$PY" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("rocm_vit.cli.verify") is None)'; then
    echo "== rocm-vit verify: not available in this checkout yet (no rocm_vit/cli/verify.py); skipped"
    return 0
  fi
  echo "== rocm-vit verify"
  "$PY" -m rocm_vit.cli.main verify "$@"
}
