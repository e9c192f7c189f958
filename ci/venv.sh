#!/usr/bin/env bash
# Create or reuse the checkout's virtualenv (.venv) and install what the tests and the CLI need.
#
# A torch already installed in $PYTHON is honoured: GPU images ship their own ROCm or CUDA build,
# so the venv is created with --system-site-packages and torch is never installed over it. On ROCm
# the PyPI `triton` wheel is never installed either: it would replace ROCm's Triton (docs/design.md, "Hazards").
# Only a python without torch gets $TORCH_SPEC (the CPU build where pip has a local wheel dir).
# Over a CPU torch, SGLang and what its import needs come from ci/requirements-sglang.txt, each
# with --no-deps, for the plugin tests (tests/test_sglang_plugin.py).
#
#   PYTHON      interpreter that creates the venv            (default: python3)
#   VENV        where                                         (default: .venv)
#   TORCH_SPEC  torch requirement when none is installed      (default: torch==2.13.0)
#   TRITON_SPEC triton requirement when none is installed, never on ROCm (default: triton==3.9.0)
#   EXTRAS      extras of rocm-vit to install                 (default: test)
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TRITON_SPEC=${TRITON_SPEC:-triton==3.9.0}
EXTRAS=${EXTRAS:-test}

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "venv: '$PYTHON' not found; install Python >= 3.10 or pass PYTHON=/path/to/python" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  venv_flags=()
  if "$PYTHON" -c 'import torch' >/dev/null 2>&1; then
    echo "venv: $PYTHON already has torch $("$PYTHON" -c 'import torch; print(torch.__version__)');" \
      "$VENV sees it through --system-site-packages"
    venv_flags=(--system-site-packages)
  fi
  if ! "$PYTHON" -m venv ${venv_flags[@]+"${venv_flags[@]}"} "$VENV"; then
    echo "venv: '$PYTHON -m venv' failed (on Debian/Ubuntu: apt-get install python3-venv)" >&2
    exit 1
  fi
  if [ ${#venv_flags[@]} -gt 0 ] && ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
    # $PYTHON is itself a venv: --system-site-packages reaches only its base interpreter, so point
    # the new venv at $PYTHON's site-packages too (after its own).
    venv_site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PYTHON" -c 'import sysconfig; print("\n".join(sorted({sysconfig.get_paths()[k] for k in ("purelib", "platlib")})))' \
      >"$venv_site/rocm-vit-base-env.pth"
  fi
fi

py="$VENV/bin/python"
# pip byte-compiles what it installs, one file at a time between its unpacking; here compileall does it
# on another core while pip installs the next packages, and once more at the end (what is new or
# changed since). As with pip, a file that does not compile (torch ships Python 3.12-only tests) is skipped.
pip_install=("$py" -m pip install --quiet --disable-pip-version-check --progress-bar off --no-compile)
site_packages=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
compiling=""
compile_installed() {
  "$py" -m compileall -q -q "$@" "$site_packages" >/dev/null 2>&1 || true
}
compile_in_background() {
  if [ -z "$compiling" ] || ! kill -0 "$compiling" 2>/dev/null; then
    compile_installed &
    compiling=$!
  fi
}

if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  echo "venv: installing $TORCH_SPEC"
  "${pip_install[@]}" "$TORCH_SPEC"
  compile_in_background
fi
torch_hip=$("$py" -c 'import torch; print(torch.version.hip or "")')

# Pin torch and Triton to what is there now, so no later install can swap them: an image's torch is
# often a local or pre-release build (2.9.0a0+git...) that a plain `torch>=2.4` might not accept.
constraints="$VENV/rocm-vit-constraints.txt"
"$py" - >"$constraints" <<'PY'
import importlib.metadata as md

for dist in ("torch", "triton", "pytorch-triton-rocm", "pytorch-triton"):
    try:
        print(f"{dist}=={md.version(dist)}")
    except md.PackageNotFoundError:
        pass
PY
pip_install+=(--constraint "$constraints")

# Build requirements first, so the editable install needs no isolated build env (works offline
# when they are already present).
mapfile -t build_requires < <("$py" - <<'PY'
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    from pip._vendor import tomli as tomllib
with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["build-system"]["requires"]))
PY
)
"${pip_install[@]}" "${build_requires[@]}"

triton_spec=()
if ! "$py" -c 'import triton' >/dev/null 2>&1; then
  if [ -n "$torch_hip" ]; then
    echo "venv: WARNING: torch is a ROCm build ($torch_hip) without Triton; not installing the PyPI" \
      "triton wheel (it would replace ROCm's Triton); tests that need Triton cannot run." >&2
  else
    # Pinned: the interpreter tests and the gfx942/gfx950 compile check (tests/aot_rocm.py, which
    # uses Triton's launch internals) were written against it; a new release must not turn CI red.
    echo "venv: installing $TRITON_SPEC (Triton-interpreter tests and the AMD compile check, on CPU)"
    triton_spec=("$TRITON_SPEC")
  fi
fi
echo "venv: installing rocm-vit (editable) with [$EXTRAS]"
"${pip_install[@]}" --no-build-isolation -e ".[$EXTRAS]" ${triton_spec[@]+"${triton_spec[@]}"}
compile_in_background

# Triton's CPU interpreter needs numpy; Triton < 3.8 breaks with numpy >= 2.4.
numpy_spec=$("$py" - <<'PY'
import importlib.metadata as md
import importlib.util


def release(dist: str) -> tuple[int, ...] | None:
    try:
        return tuple(int(p) for p in md.version(dist).split("+")[0].split(".")[:2])
    except (md.PackageNotFoundError, ValueError):
        return None


triton = next((v for d in ("triton", "pytorch-triton-rocm", "pytorch-triton") if (v := release(d))), None)
if triton is not None:
    old_triton = triton < (3, 8)
    if importlib.util.find_spec("numpy") is None:
        print("numpy<2.4" if old_triton else "numpy")
    elif old_triton and (release("numpy") or (0,)) >= (2, 4):
        print("numpy<2.4")
PY
)
if [ -n "$numpy_spec" ]; then
  echo "venv: installing '$numpy_spec' for Triton's interpreter"
  "${pip_install[@]}" "$numpy_spec"
fi

# SGLang for the plugin tests, over a CPU torch only: SGLang's own requirements pull CUDA wheels and
# another torch, so it and what its import needs go in one by one with --no-deps from a pinned list.
torch_cuda=$("$py" -c 'import torch; print(torch.version.cuda or "")')
if [ -z "$torch_hip" ] && [ -z "$torch_cuda" ]; then
  echo "venv: installing SGLang for the plugin tests (ci/requirements-sglang.txt, --no-deps)"
  "${pip_install[@]}" --no-deps -r ci/requirements-sglang.txt
fi
if [ -n "$compiling" ]; then
  wait "$compiling" || true
fi
compile_installed -j 0
echo "venv: ready: $("$py" -c 'import sys, torch; print(sys.executable, "torch", torch.__version__)')"
