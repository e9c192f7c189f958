"""Hazard self-checks: one small, deliberate test per known upstream problem, on the user's own stack.

Each ``check_*`` takes its device work as arguments (real ones: ``rocm_vit.report.probes``; tests pass
misbehaving stand-ins) and returns a ``Verdict``. ``rocm-vit report`` runs each check in a process of its
own (``rocm_vit.cli.hazard_check``: a hazard may leave the GPU context unusable). Evidence: docs/rocm.md, "Hazards".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import torch

OK = "ok"
HAZARD_FOUND = "hazard_found"
SKIPPED = "skipped"
NOT_APPLICABLE = "not_applicable"


HAZARDS: dict[str, str] = {
    "aiter_kernels": "the aiter module each rocm-vit call loads is already built in this install (no JIT compile)",
    "host_copy_offsets": "a host-to-device copy into what a graph reads, right before its replay (ROCm/hip#3902)",
    "capture_errors": "a capture-unsafe op inside a graph capture is reported, not swallowed (pytorch#155684)",
    "graph_equals_eager": "the preset tower's graph replays equal its eager output, bit for bit",
}
# Found, these fail the report: rocm-vit cannot work around them (it avoids the others).
FAILING_HAZARDS = frozenset({"graph_equals_eager"})


@dataclass(frozen=True)
class Verdict:
    """What one check found: a status, a one-line ``summary`` and JSON ``details``."""

    status: str
    summary: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# aiter kernels ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AiterCall:
    """One attention call rocm-vit makes through aiter and the compiled module it loads."""

    backend: str
    dtype: str
    head_dim: int
    module: str


def check_aiter_kernels(
    calls: Sequence[AiterCall], where_built: Callable[[str], str | None] | None, install: str
) -> Verdict:
    """Whether each call's module is built; ``where_built=None``: aiter does not apply (``install`` says why)."""
    if where_built is None:
        return Verdict(NOT_APPLICABLE, install)
    rows = [{**asdict(call), "built": where_built(call.module)} for call in calls]
    missing = sorted({row["module"] for row in rows if row["built"] is None})
    details = {"install": install, "calls": rows}
    if missing:
        return Verdict(
            HAZARD_FOUND,
            f"would compile on first request: {', '.join(missing)} (rocm-vit builds it while the tower is "
            "constructed, minutes of hipcc; without rocm-vit, inside the first request)",
            details,
        )
    return Verdict(
        OK, f"all {len(set(r['module'] for r in rows))} modules rocm-vit loads are built ({install})", details
    )


# offsets after host copies (ROCm/hip#3902) -------------------------------------------------------


class Reading(NamedTuple):
    """One copy-replay-read round: fresh offsets read, and output equal to eager."""

    offsets_current: bool
    output_current: bool


def check_host_copy_offsets(
    copy_replay_read: Callable[[int], Reading] | None, rounds: int, why_not: str = ""
) -> Verdict:
    """Run ``copy_replay_read(i)`` for ``rounds`` rounds and count the stale reads."""
    if copy_replay_read is None:
        return Verdict(SKIPPED, why_not)
    readings = [copy_replay_read(index) for index in range(rounds)]
    stale_offsets = sum(not reading.offsets_current for reading in readings)
    stale_outputs = sum(not reading.output_current for reading in readings)
    details = {"rounds": rounds, "stale_offsets": stale_offsets, "stale_outputs": stale_outputs}
    if stale_offsets or stale_outputs:
        first = next(index for index, reading in enumerate(readings) if not all(reading))
        return Verdict(
            HAZARD_FOUND,
            f"stale after a host-to-device copy: offsets in {stale_offsets}, attention output in {stale_outputs} of "
            f"{rounds} replays (first at round {first}); rocm-vit never copies into what a graph reads",
            {**details, "first_stale_round": first},
        )
    return Verdict(OK, f"no stale read in {rounds} copy-then-replay rounds", details)


# capture errors (pytorch#155684) -----------------------------------------------------------------


def check_capture_errors(
    capture_unsafe: Callable[[], BaseException | None] | None, op: str, why_not: str = ""
) -> Verdict:
    """``capture_unsafe()`` returns what capturing ``op`` raised; ``None`` is the hazard."""
    if capture_unsafe is None:
        return Verdict(SKIPPED, why_not)
    error = capture_unsafe()
    if error is None:
        return Verdict(
            HAZARD_FOUND,
            f"swallowed: a capture around {op} ended without an error, so a broken capture goes unreported here; "
            "rocm-vit compares every new graph's first replay with an eager run for this reason",
            {"op": op, "raised": None},
        )
    raised = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
    return Verdict(OK, f"reported: capturing {op} raised {raised}", {"op": op, "raised": raised})


# graph == eager ----------------------------------------------------------------------------------


def check_graph_equals_eager(
    encode: Callable[[int, bool], torch.Tensor] | None,
    layouts: Sequence[str],
    runner_stats: Callable[[], dict[str, Any]] | None,
    why_not: str = "",
) -> Verdict:
    """Each layout captured, then replayed after the others: both bitwise equal to eager.

    A first replay that differed from eager, or a failed capture, in ``runner_stats()`` is a finding too.
    """
    if encode is None or runner_stats is None:
        return Verdict(SKIPPED, why_not)
    mismatches = []
    schedule = [*range(len(layouts)), *reversed(range(len(layouts)))]
    for index in schedule:
        graph_out = encode(index, True)
        eager_out = encode(index, False)
        if not bitwise_equal(graph_out, eager_out):
            mismatches.append(layouts[index])
    stats = runner_stats()
    eager_runs = stats.get("eager_runs", {})
    details = {
        "layouts": len(layouts),
        "runs": len(schedule),
        "mismatched": mismatches,
        "captures": stats.get("captures", 0),
        "replays": stats.get("replays", 0),
        "capture_unverified": eager_runs.get("capture_unverified", 0),
        "capture_failed": eager_runs.get("capture_failed", 0),
    }
    problems = []
    if mismatches:
        problems.append(f"{len(mismatches)} of {len(schedule)} runs differ from eager (first: {mismatches[0]})")
    if details["capture_unverified"]:
        problems.append(f"{details['capture_unverified']} captures replayed differently from eager")
    if details["capture_failed"]:
        problems.append(f"{details['capture_failed']} captures failed where eager worked")
    if not details["captures"]:
        problems.append("no layout was captured, so graphs never ran")
    if problems:
        return Verdict(HAZARD_FOUND, "; ".join(problems), details)
    return Verdict(
        OK,
        f"{len(schedule)} runs over {len(layouts)} layouts equal eager bit for bit "
        f"({details['captures']} captures, {details['replays']} replays)",
        details,
    )


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and bytes (NaNs included, unlike ``torch.equal``)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
