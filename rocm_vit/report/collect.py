"""Run the report's parts and gather what they found into one document: the content of report.json.

Invariants: keys are stable (every ``SECTIONS`` key, every hazard with a verdict, ``problems``); this
process only reads versions and the platform; everything else runs in processes of its own.
"""

from __future__ import annotations

import dataclasses
import os
import platform as python_platform
import shutil
import sys
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rocm_vit.report.hazards import FAILING_HAZARDS, HAZARD_FOUND, HAZARDS
from rocm_vit.report.parts import FAILED, OK, SKIPPED, TIMED_OUT, Part, PartResult, plan, run_part

REPORT_FORMAT = 1
SECTIONS = (
    "versions",
    "tune",
    "doctor",
    "hazards",
    "verify_inference",
    "verify_no_grad",
    "bench",
    "bench_attn",
    "graph_memory",
    "graph_admission",
)
# Distributions whose versions a bug report needs (from installed metadata: nothing is imported).
_PACKAGES = {
    "torch": ("torch",),
    "triton": ("triton", "pytorch-triton-rocm", "pytorch-triton"),
    "aiter": ("amd-aiter", "aiter"),
    "flash_attn_4": ("flash-attn-4",),
    "sglang": ("sglang",),
    "transformers": ("transformers",),
}

Progress = Callable[[list[Part]], Iterable[Part]]


def collect(preset_name: str | None, quick: bool, folder: Path, progress: Progress = iter) -> dict[str, Any]:
    """Run every part into ``folder`` (which must exist); ``preset_name`` None: qwen3-vl-8b on a GPU, tiny on CPU."""
    from rocm_vit.models import preset
    from rocm_vit.profile import default_profile_path, profile_path

    versions, info = _versions()
    on_gpu = info is not None and info.name != "cpu"
    preset_name = preset_name or ("qwen3-vl-8b" if on_gpu else "tiny")
    config = preset(preset_name)
    profile_file = profile_path(info) if info is not None else None
    parts = plan(
        preset_name,
        quick,
        on_gpu,
        head_dim=config.hidden_size // config.num_heads,
        heads=config.num_heads,
        profile_out=profile_file,
        plots=_has_matplotlib(),
    )
    results = {part.key: run_part(part, folder, on_gpu) for part in progress(parts)}
    sections: dict[str, Any] = {"versions": {"status": OK if info is not None else FAILED, "data": versions}}
    for key in SECTIONS[1:]:
        if key == "hazards":
            sections[key] = _hazards(results)
            continue
        result = results.get(key) or PartResult(SKIPPED, detail=_why_not_planned(key, quick))
        sections[key] = dataclasses.asdict(result)
    tuned_file = profile_file or (default_profile_path(info) if info is not None else None)
    if results.get("tune") and results["tune"].status == OK and tuned_file and tuned_file.is_file():
        shutil.copyfile(tuned_file, folder / "profile.yaml")
        sections["tune"]["profile"] = {"path": str(tuned_file), "copy": "profile.yaml", "yaml": tuned_file.read_text()}
    document = {
        "report_format": REPORT_FORMAT,
        "rocm_vit": {"version": versions["rocm_vit"], "commit": versions["commit"]},
        "created": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "options": {"preset": preset_name, "quick": quick, "folder": str(folder)},
        "sections": sections,
        "plots": sorted(path.name for path in folder.glob("*.png")),
    }
    document["problems"] = problems(document)
    return document


def problems(document: dict[str, Any]) -> list[str]:
    """One line per part that failed or timed out, per hazard found (marked when it fails the report),
    and per stream that graphs made slower than all-eager once the runner was warm (not a failure:
    a figure for the issue)."""
    lines = []
    for key, section in document["sections"].items():
        if key != "hazards" and section["status"] in (FAILED, TIMED_OUT):
            lines.append(f"{key}: {section['status']}: {_first_line(section.get('detail', ''))}")
    for name, check in document["sections"]["hazards"]["checks"].items():
        if check["status"] in (FAILED, TIMED_OUT):
            lines.append(f"hazard {name}: the check {check['status']}: {check['summary']}")
        elif check["status"] == HAZARD_FOUND:
            lines.append(f"hazard {name}{' (fails the report)' if name in FAILING_HAZARDS else ''}: {check['summary']}")
    return lines + slower_streams(document["sections"]["graph_admission"].get("data"))


def slower_streams(admission: Any) -> list[str]:
    """``bench-traffic --mode tower``'s streams whose second half ran slower under graphs than all-eager,
    by more than its limits (1 % on the mean, 2 % on p90)."""
    from rocm_vit.workloads.traffic import slower_than_eager

    lines = []
    for stream in admission.get("streams", []) if isinstance(admission, dict) else []:
        half = stream["second_half"]
        if slower_than_eager(half["eager"], half["graphs"]):
            mean = half["graphs"]["mean_ms"] / half["eager"]["mean_ms"]
            p90 = half["graphs"]["p90_ms"] / half["eager"]["p90_ms"]
            lines.append(
                f"graph_admission: {stream['stream']}: graphs slower than all-eager once warm "
                f"(mean {mean:.3f}x, p90 {p90:.3f}x)"
            )
    return lines


def exit_status(document: dict[str, Any]) -> int:
    """1 when a part failed or timed out or a hazard rocm-vit cannot work around was found, else 0."""
    failed = any(s["status"] in (FAILED, TIMED_OUT) for k, s in document["sections"].items() if k != "hazards")
    checks = document["sections"]["hazards"]["checks"]
    failed |= any(check["status"] in (FAILED, TIMED_OUT) for check in checks.values())
    failed |= any(checks[name]["status"] == HAZARD_FOUND for name in FAILING_HAZARDS)
    return int(failed)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _hazards(results: dict[str, PartResult]) -> dict[str, Any]:
    """Per check: the verdict it printed, or how its process ended when it printed none."""
    checks = {}
    for name, description in HAZARDS.items():
        result = results.get(f"hazard_{name}") or PartResult(SKIPPED, detail="not run")
        part = {k: v for k, v in dataclasses.asdict(result).items() if k != "data"}
        verdict = result.data if isinstance(result.data, dict) and "status" in result.data else None
        if result.status == OK and verdict is not None:
            checks[name] = {"check": description, **verdict, "part": part}
        else:
            summary = result.detail or "no verdict printed"
            checks[name] = {
                "check": description,
                "status": FAILED if result.status == OK else result.status,  # OK: ran, printed no verdict
                "summary": summary,
                "details": {},
                "part": part,
            }
    statuses = {check["status"] for check in checks.values()}
    worst = next((s for s in (FAILED, TIMED_OUT, HAZARD_FOUND) if s in statuses), OK)
    return {"status": worst, "checks": checks}


def _why_not_planned(key: str, quick: bool) -> str:
    if quick and key in ("tune", "graph_memory", "graph_admission"):
        return "not part of a --quick report"
    return "not run"


def _versions() -> tuple[dict[str, Any], Any]:
    """The versions section, and the platform (None when it could not be read: the section says why)."""
    from rocm_vit.version import build_info, installed_distribution

    info = build_info()
    versions: dict[str, Any] = {
        "rocm_vit": info["rocm_vit"],
        "commit": info["commit"],
        "python": f"{python_platform.python_version()} ({sys.executable})",
        "os": python_platform.platform(),
    }
    versions["rocm"] = _rocm_version()
    for name, distributions in _PACKAGES.items():
        found = installed_distribution(distributions)
        versions[name] = f"{found[1]} ({found[0]})" if found else "not installed"
    try:
        import torch

        from rocm_vit.platform import platform_info

        versions["torch_hip"] = torch.version.hip
        versions["torch_cuda"] = torch.version.cuda
        platform = platform_info()
    except Exception as err:  # reported in the section: the rest of the report still runs
        versions["platform_error"] = f"{type(err).__name__}: {err}"
        return versions, None
    versions["platform"] = dataclasses.asdict(platform)
    return versions, platform


def _rocm_version() -> str | None:
    """The ROCm install's version file (``$ROCM_PATH/.info/version``), or None where there is none."""
    path = Path(os.environ.get("ROCM_PATH", "/opt/rocm")) / ".info" / "version"
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _has_matplotlib() -> bool:
    import importlib.util

    return importlib.util.find_spec("matplotlib") is not None
