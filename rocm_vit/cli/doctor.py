"""``rocm-vit doctor``: what this machine would run, and why, before anyone files a bug.

Invariants: versions come from metadata, never imports (importing aiter runs rocminfo); each section
is computed on its own, so a failure is reported in place; exit status 1 when anything failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform as python_platform
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rocm_vit.version import KEYED_DISTRIBUTIONS, installed_distribution

if TYPE_CHECKING:  # these import torch: doctor imports them only where a section needs them
    from rocm_vit.graphs.options import RunnerOptions
    from rocm_vit.graphs.padding import Padding
    from rocm_vit.policy import Policy

NOT_INSTALLED = "not installed"

# import name -> distributions providing it, preferred first (flash_attn_4 is never looked up on the path).
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    **KEYED_DISTRIBUTIONS,
    "sglang": ("sglang",),
    "transformers": ("transformers",),
}
_ENV_PREFIXES = ("SGLANG_", "ROCM_VIT_")
_RUNNER_PRESET = "qwen3-vl-8b"  # the tower the runner's options are shown for
# Layouts whose kernel the report names, as Qwen3-VL patches them (16 pixels, default pixel limits).
_EXAMPLE_LAYOUTS = {
    "1x196 (a 224x224 image)": (196,),
    "1x8160 (a 1080p screenshot)": (8160,),
    "1x47376 (a phone photo)": (47376,),
}
# Layouts whose padding the report names: where graphs pay, sizes that rarely repeat.
_PADDING_EXAMPLES = {
    "1x196 (a 224x224 image)": (196,),
    "1x1200 (a 640x480 image)": (1200,),
    "6x880 (six 640x360 images)": (880,) * 6,
    "1x4920 (a 1.3 MP photo)": (4920,),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    report = collect()
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 1 if report["problems"] else 0


def collect() -> dict[str, Any]:
    """The doctor report as plain data; ``problems`` lists every section that failed."""
    problems: list[str] = []
    report: dict[str, Any] = {
        "rocm_vit": _rocm_vit_version(),
        "python": f"{python_platform.python_version()} ({sys.executable})",
        "platform": _section("platform", _platform, problems),
        "versions": _versions(),
        "policy": _section("policy", _policy, problems),
        "settings": _section("settings", _settings, problems),
        "sglang": _section("sglang", _sglang, problems),
        "launches": _section("launches", _launches, problems),
        "environment": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
    }
    report["problems"] = problems
    return report


def format_report(report: dict[str, Any]) -> str:
    """The report as aligned text sections."""
    rocm_vit = report["rocm_vit"]
    lines = [f"rocm-vit {rocm_vit['version']}  commit {rocm_vit['commit']}", f"python   {report['python']}"]
    for section in ("platform", "versions", "policy", "settings", "sglang", "launches", "environment"):
        values = report[section]
        lines.append(f"\n{section}:")
        if not values:
            lines.append("  (none set)")
        lines.extend(_aligned(values, indent="  "))
    if report["problems"]:
        lines.append("\nproblems:")
        lines.extend(f"  - {problem}" for problem in report["problems"])
    return "\n".join(lines)


def _aligned(values: dict[str, Any], indent: str) -> list[str]:
    """``key  value`` lines with the values aligned; a nested mapping is listed below its key."""
    width = max((len(key) for key in values), default=0)
    lines = []
    for key, value in values.items():
        if isinstance(value, dict):
            lines.append(f"{indent}{key}:")
            lines.extend(_aligned(value, indent + "  "))
        else:
            lines.append(f"{indent}{key:<{width}}  {_text(value)}")
    return lines


def _section(name: str, build: Callable[[], dict[str, Any]], problems: list[str]) -> dict[str, Any]:
    """Run one section's ``build``; an exception, or an ``error`` entry it returns, becomes a problem."""
    try:
        values = build()
    except Exception as err:  # reported, never raised: the doctor must always print
        values = {"error": f"{type(err).__name__}: {err}"}
    if "error" in values:
        problems.append(f"{name}: {values['error']}")
    return values


def _platform() -> dict[str, Any]:
    from rocm_vit.platform import platform_info

    info = platform_info()
    values = {
        "name": info.name,
        "device_name": info.device_name,
        "arch": info.arch,
        "device_count": info.device_count,
    }
    if info.emulated_on:
        values["emulating"] = f"ROCm {info.arch} decisions on this {info.emulated_on} GPU (ROCM_VIT_EMULATE)"
    return values


def _versions() -> dict[str, Any]:
    versions: dict[str, Any] = {"python": python_platform.python_version()}
    versions.update({name: _installed_version(name) for name in _DISTRIBUTIONS})
    try:
        import torch
    except Exception:  # reported as the platform section's error
        return versions
    versions["torch_hip"] = torch.version.hip
    versions["torch_cuda"] = torch.version.cuda
    return versions


def _installed_version(import_name: str) -> str:
    found = installed_distribution(_DISTRIBUTIONS[import_name])
    if found is not None:
        distribution, version = found
        return version if distribution == import_name else f"{version} ({distribution})"
    # Found on the path without metadata (a source checkout); locating does not import it.
    if importlib.util.find_spec(import_name) is not None:
        return "installed (version unknown)"
    return NOT_INSTALLED


def _policy() -> dict[str, Any]:
    from rocm_vit.attention import BACKENDS
    from rocm_vit.backend_requirements import REQUIREMENTS
    from rocm_vit.policy import active_policy

    policy = active_policy()
    values = policy.report()
    name = policy.attention.backend
    values["attention"]["per_layout"] = {
        label: "{}: {}".format(*policy.attention.pick(seq_lens)) for label, seq_lens in _EXAMPLE_LAYOUTS.items()
    }
    values["attention"]["can_run"] = {
        backend: _verdict(needs.unavailable_reason(policy.facts), needs.head_dims)
        for backend, needs in REQUIREMENTS.items()
    }
    values["attention"]["known"] = sorted(BACKENDS)
    options = _runner_options(policy)
    values["graph_padding"] = _padding_report(options.padding)
    values["graph_runner"] = {"for": f"{_RUNNER_PRESET} under SGLang", **options.report()}
    if name not in BACKENDS:
        values["error"] = f"attention backend {name!r} is unknown"
    elif missing := REQUIREMENTS[name].unavailable_reason(policy.facts):
        values["error"] = f"attention backend {name!r} cannot run on {policy.facts.platform}: {missing}"
    return values


def _runner_options(policy: Policy) -> RunnerOptions:
    """The graph runner's options (``rocm_vit.policy.runner_options``) for Qwen3-VL-8B under SGLang:
    what a tower or the adapter is built with from these settings and this policy, padding included."""
    from rocm_vit.policy import runner_options
    from rocm_vit.settings import load_settings
    from rocm_vit.tower_config import preset

    return runner_options(policy, load_settings(), preset(_RUNNER_PRESET).depth, takes_device_offsets=True)


def _padding_report(padding: Padding | None) -> dict[str, Any]:
    """The buckets padded layouts run at, the calls (one image or two) that capture them before
    serving (Qwen-VL's merge of 2; ``SGLANG_VIT_CUDA_GRAPH_CAPTURE_BUCKETS``), and what the runner's
    padding decides for a few layouts; ``padding`` off (``SGLANG_VIT_CUDA_GRAPH_PADDING=0``): says so."""
    from rocm_vit.layout import AttentionLayout, Segmentation

    if padding is None:
        return {"buckets": "none: exact layouts only (SGLANG_VIT_CUDA_GRAPH_PADDING=0)"}
    per_layout = {}
    for label, seq_lens in _PADDING_EXAMPLES.items():
        padded = padding.padded(AttentionLayout({"full": Segmentation.from_lengths(seq_lens)}))
        per_layout[label] = "as it is" if padded is None else f"padded to {padded.num_patches}"
    calls = padding.bucket_call_grids(merge=2)
    shown = (" + ".join(f"{h}x{w}" for _, h, w in grids) for grids in calls)
    at_start = f"{len(calls)} calls (patches): " + ", ".join(shown)
    return {"buckets": ", ".join(map(str, padding.buckets)), "captured_at_start": at_start, "per_layout": per_layout}


def _verdict(missing: str | None, head_dims: tuple[int, ...] | None) -> str:
    if missing is not None:
        return f"no: {missing}"
    return f"yes, head dims {', '.join(map(str, head_dims))}" if head_dims else "yes"


def _settings() -> dict[str, Any]:
    from rocm_vit.settings import CONFIG_ENV, load_settings

    values = load_settings().as_dict()
    values["config_file"] = os.environ.get(CONFIG_ENV) or None
    return values


def _sglang() -> dict[str, Any]:
    from rocm_vit.integrations.sglang.status import plugin_status

    return plugin_status()


def _launches() -> dict[str, Any]:
    """Whether Triton launches bypass ``JITFunction.run`` here (``backends/fast_launch.py``), and why."""
    try:
        from rocm_vit.backends.fast_launch import fast_path_state
    except ImportError as err:  # no Triton: nothing to launch fast, not a problem
        return {"fast_path": "off", "why": f"Triton cannot be imported: {err}"}
    on, why = fast_path_state()
    return {"fast_path": "on" if on else "off", "why": why}


def _rocm_vit_version() -> dict[str, str]:
    """``{"version", "commit"}``: the commit as rocm_vit/version.py finds it (stamped when built)."""
    from rocm_vit.version import build_info

    info = build_info()
    return {"version": info["rocm_vit"], "commit": info["commit"]}


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(str(item) for item in value) or "(none)"
    return "-" if value is None or value == "" else str(value)
