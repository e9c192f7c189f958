# rocm-vit developer entry points. The test command is `make test` (CI runs it through .ci/run).
#
#   make venv       create or reuse .venv and install rocm-vit (editable) with its test extra
#   make test       CPU suite: lint + every test not marked gpu/rocm          (ci/cpu.sh)
#   make gpu-test   NVIDIA tier: gpu tests + `rocm-vit verify`, natively, then emulating ROCm (ci/cuda.sh)
#   make rocm-test  AMD Instinct tier with aiter, SGLANG_USE_AITER=1, offline  (ci/rocm.sh)
#   make run        `rocm-vit doctor`, then `rocm-vit bench` on its default preset
#   make lint | wheel | clean | distclean
#
# Variables: PYTHON (interpreter that creates the venv, default python3), VENV (default .venv),
# TORCH_SPEC (torch to install when $(PYTHON) has none, default torch==2.13.0), EXTRAS (default
# test), BENCH_ARGS (extra arguments for `make run`). A torch already present in $(PYTHON) (a ROCm
# or CUDA image) is reused through --system-site-packages, never replaced.

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= test
BENCH_ARGS ?=

VENV_PY := $(abspath $(VENV))/bin/python
STAMP := $(VENV)/.rocm-vit-installed
# The CPU suite runs in the venv; the GPU scripts pick their own interpreter (see ci/common.sh).
IN_VENV := PATH="$(abspath $(VENV))/bin:$$PATH" PYTHON="$(VENV_PY)"
# PYTHON reaches the GPU scripts only when the user set it; otherwise they find the GPU python.
GPU_ENV := VENV="$(VENV)" TORCH_SPEC="$(TORCH_SPEC)" EXTRAS="$(EXTRAS)" \
	$(if $(filter-out default file,$(origin PYTHON)),PYTHON="$(PYTHON)")

.PHONY: help venv test gpu-test rocm-test lint run wheel clean distclean

help:
	@sed -n '1,/^$$/p' Makefile | sed 's/^# \{0,1\}//'

venv: $(STAMP)

$(STAMP): pyproject.toml ci/venv.sh ci/requirements-sglang.txt
	PYTHON="$(PYTHON)" VENV="$(VENV)" TORCH_SPEC="$(TORCH_SPEC)" EXTRAS="$(EXTRAS)" ci/venv.sh
	@touch $@

test: $(STAMP)
	$(IN_VENV) ci/cpu.sh

gpu-test:
	$(GPU_ENV) ci/cuda.sh

rocm-test:
	$(GPU_ENV) ci/rocm.sh

lint: $(STAMP)
	$(VENV_PY) -m ruff check .
	$(VENV_PY) -m ruff format --check .

run: $(STAMP)
	$(IN_VENV) rocm-vit doctor
	$(IN_VENV) rocm-vit bench $(BENCH_ARGS)

wheel: $(STAMP)
	rm -rf build  # stale build/lib files would end up in the wheel
	$(VENV_PY) -m build --wheel --no-isolation --skip-dependency-check --outdir dist .

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
