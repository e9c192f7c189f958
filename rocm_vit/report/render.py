"""report.md from the report's document (``rocm_vit.report.collect``): one heading per section.

The headings are stable (``HEADINGS``; docs/rocm.md says what each means) and every section is
written whatever happened: a part that failed shows how, with the path of its log. Picks of the
policy are in bold in the timing tables. Pure: from the document to text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

HEADINGS = {
    "summary": "Summary",
    "versions": "Versions",
    "doctor": "Doctor: the policy and why",
    "hazards": "Hazards",
    "verify": "Verify: graph output against eager",
    "tune": "Tune",
    "bench": "Bench: the tower, eager and graphs",
    "bench_attn": "Bench attention",
    "graph_memory": "Graph memory",
    "graph_admission": "Graph admission on serving streams",
    "logs": "Logs",
}
_VERDICT_TEXT = {
    "ok": "ok",
    "hazard_found": "**HAZARD FOUND**",
    "skipped": "skipped",
    "not_applicable": "not applicable",
    "failed": "**CHECK FAILED**",
    "timed_out": "**CHECK TIMED OUT**",
}


def to_markdown(document: dict[str, Any]) -> str:
    """The whole report as markdown."""
    sections = document["sections"]
    options = document["options"]
    platform = sections["versions"]["data"].get("platform") or {}
    device = platform.get("device_name", "unknown device")
    if platform.get("emulated_on"):
        device += f" emulating ROCm {platform['arch']}"
    elif platform.get("arch"):
        device += f" ({platform['arch']})"
    lines = [
        "# rocm-vit report",
        "",
        f"rocm-vit {document['rocm_vit']['version']}, commit `{document['rocm_vit']['commit']}`, on {device}; "
        f"preset `{options['preset']}`{', --quick' if options['quick'] else ''}; {document['created']}.",
    ]
    renderers: list[tuple[str, Callable[[dict[str, Any]], list[str]]]] = [
        ("summary", _summary),
        ("versions", _versions),
        ("doctor", _doctor),
        ("hazards", _hazards),
        ("verify", _verify),
        ("tune", _tune),
        ("bench", _bench),
        ("bench_attn", _bench_attn),
        ("graph_memory", _graph_memory),
        ("graph_admission", _graph_admission),
        ("logs", _logs),
    ]
    for key, render in renderers:
        lines += ["", f"## {HEADINGS[key]}", "", *render(document)]
    return "\n".join(lines) + "\n"


def _summary(document: dict[str, Any]) -> list[str]:
    rows = []
    for key, section in document["sections"].items():
        if key == "hazards":
            for name, check in section["checks"].items():
                rows.append(
                    [
                        f"hazard: {name}",
                        _VERDICT_TEXT.get(check["status"], check["status"]),
                        _seconds(check["part"]),
                        _first_line(check["summary"]),
                    ]
                )
            continue
        rows.append([key, section["status"], _seconds(section), _first_line(section.get("detail", ""))])
    problems = document["problems"]
    lines = _table(["part", "status", "seconds", "note"], rows)
    lines += ["", "Problems:" if problems else "Problems: none.", *(f"- {_first_line(p)}" for p in problems)]
    return lines


def _versions(document: dict[str, Any]) -> list[str]:
    data = dict(document["sections"]["versions"]["data"])
    platform = data.pop("platform", None) or {}
    rows = [[key, f"`{value}`"] for key, value in data.items()]
    rows += [[f"platform.{key}", f"`{value}`"] for key, value in platform.items()]
    return _table(["what", "version"], rows)


def _doctor(document: dict[str, Any]) -> list[str]:
    section = document["sections"]["doctor"]
    if not isinstance(section.get("data"), dict):
        return _not_there(section)
    doctor = section["data"]
    policy = doctor.get("policy", {})
    rows = []
    for choice, values in policy.items():
        if not isinstance(values, dict):
            continue
        why = values.get("why", values.get("in_force", ""))
        value = ", ".join(f"{k}={v}" for k, v in values.items() if k not in ("why", "known", "in_force"))
        rows.append([choice, value or "-", str(why)])
    launches = doctor.get("launches") or {}
    if "fast_path" in launches:
        rows.append(["triton fast launch", launches["fast_path"], launches.get("why", "")])
    lines = _table(["choice", "value", "why"], rows)
    if doctor.get("problems"):
        lines += ["", "Doctor's problems:", *(f"- {problem}" for problem in doctor["problems"])]
    environment = doctor.get("environment") or {}
    lines += [
        "",
        "Settings in the environment: " + (", ".join(f"`{k}={v}`" for k, v in environment.items()) or "none."),
    ]
    return lines


def _hazards(document: dict[str, Any]) -> list[str]:
    checks = document["sections"]["hazards"]["checks"]
    rows = [
        [name, _VERDICT_TEXT.get(c["status"], c["status"]), c["summary"].replace("\n", " ")]
        for name, c in checks.items()
    ]
    lines = _table(["check", "verdict", "what it found"], rows)
    aiter = checks.get("aiter_kernels", {}).get("details", {})
    if aiter.get("calls"):
        lines += ["", f"aiter modules ({aiter['install']}):", ""]
        lines += _table(
            ["backend", "dtype", "head dim", "module", "built"],
            [
                [c["backend"], c["dtype"], str(c["head_dim"]), f"`{c['module']}`", c["built"] or "**no**"]
                for c in aiter["calls"]
            ],
        )
    return lines


def _verify(document: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for key in ("verify_inference", "verify_no_grad"):
        section = document["sections"][key]
        lines.append(f"- {key.removeprefix('verify_')}: " + _verify_line(section))
    return lines


def _verify_line(section: dict[str, Any]) -> str:
    data = section.get("data")
    if not isinstance(data, dict) or "rows" not in data:
        return f"{section['status']}. {_first_line(section.get('detail', ''))}"
    rows = data["rows"]
    exact = sum(row["exact"] for row in rows)
    runner = data.get("runner", {})
    return (
        f"{exact} of {len(rows)} runs exact on {data.get('device', '?')}; captures {runner.get('captures')}, replays "
        f"{runner.get('replays')}, evictions {runner.get('evictions')}, eager {runner.get('eager_runs')}"
        + ("" if exact == len(rows) else " — **MISMATCH**: " + ", ".join(r["layout"] for r in rows if not r["exact"]))
    )


def _tune(document: dict[str, Any]) -> list[str]:
    section = document["sections"]["tune"]
    if section["status"] == "skipped":
        return [f"skipped: {section['detail']}."]
    lines = []
    if section.get("profile"):
        lines += [f"Profile written to `{section['profile']['path']}` (copied here as `profile.yaml`).", ""]
    if section["status"] != "ok":
        lines += [*_not_there(section), ""]
    if isinstance(section.get("data"), str) and section["data"].strip():
        lines += ["```text", section["data"].rstrip(), "```"]
    if "tune.png" in document["plots"]:
        lines += ["", "![tune](tune.png)"]
    return lines


# bench's columns of an eager call's cost (rocm_vit.cli.bench.LAUNCH_COLUMNS); rows from before them lack them.
_LAUNCH_COLUMNS = (
    ("host_ms", "host ms", "{:.2f}"),
    ("device_ms", "device ms", "{:.2f}"),
    ("kernels", "kernels", "{}"),
    ("host_us_per_launch", "host us/launch", "{:.1f}"),
)


def _bench(document: dict[str, Any]) -> list[str]:
    section = document["sections"]["bench"]
    data = section.get("data")
    if not isinstance(data, dict) or "rows" not in data:
        return _not_there(section)
    graphs = bool(data["rows"]) and "graph_ms" in data["rows"][0]
    saves, why = _graph_pick(document, data) if graphs else (None, "")
    lines = [
        f"preset `{data['preset']}`, {data['dtype']}, attention `{data['attention_backend']}`, median of "
        f"{data['repeats']} on {data['device']}. {why}",
        "",
    ]
    rows = []
    for row in data["rows"]:
        pick = "graph" if saves is not None and saves(row) else "eager"
        eager = f"{row['eager_ms']:.2f}"
        cells = [row["layout"], str(row["patches"]), eager if pick != "eager" or not graphs else f"**{eager}**"]
        if graphs:
            graph = f"{row['graph_ms']:.2f}"
            faster = "graph" if row["graph_ms"] < row["eager_ms"] else "eager"
            cells += [
                f"**{graph}**" if pick == "graph" else graph,
                f"{row['speedup']:.2f}x",
                pick,
                "yes" if pick == faster else "no",
            ]
        cells += ["-" if row[key] is None else fmt.format(row[key]) for key, _, fmt in _LAUNCH_COLUMNS if key in row]
        rows.append([*cells, row["check"]])
    header = ["layout", "patches", "eager ms"]
    header += ["graph ms", "speedup", "policy", "pick fastest"] if graphs else []
    header += [title for key, title, _ in _LAUNCH_COLUMNS if data["rows"] and key in data["rows"][0]]
    lines += _table([*header, "check"], rows)
    if "bench.png" in document["plots"]:
        lines += ["", "![bench](bench.png)"]
    if section["status"] != "ok":
        lines += ["", *_not_there(section)]
    return lines


def _bench_attn(document: dict[str, Any]) -> list[str]:
    section = document["sections"]["bench_attn"]
    data = section.get("data")
    if not isinstance(data, dict) or "results" not in data:
        return _not_there(section)
    backends = list(dict.fromkeys(row["backend"] for row in data["results"]))
    picks = {row["layout"]: row for row in data.get("policy_picks", [])}
    lines = [
        f"{data.get('device')} ({data.get('arch')}), {data.get('heads')} heads, bf16; median ms per call; the "
        "policy's pick in bold; `fastest` among the kernels the policy may pick.",
        "",
    ]
    rows = []
    for layout in dict.fromkeys(row["layout"] for row in data["results"]):
        by_backend = {row["backend"]: row for row in data["results"] if row["layout"] == layout}
        pick = picks.get(layout, {})
        cells = [layout, str(next(iter(by_backend.values()))["tokens"])]
        for backend in backends:
            row = by_backend.get(backend, {})
            text = f"{row['ms']:.3f}" if "ms" in row else ("error" if "error" in row else "-")
            cells.append(f"**{text}**" if backend == pick.get("picked") else text)
        cells += [pick.get("picked", "-"), pick.get("fastest") or "-"]
        rows.append(cells)
    lines += _table(["layout", "tokens", *backends, "policy", "fastest"], rows)
    for name, why in data.get("skipped_backends", {}).items():
        lines.append(f"- not measured: {name}: {why}")
    return lines


def _graph_memory(document: dict[str, Any]) -> list[str]:
    lines = []
    bench = document["sections"]["bench"].get("data")
    runner = bench.get("runner") if isinstance(bench, dict) else None
    if runner:
        mib = 2**20
        lines.append(
            f"After bench: {runner['graphs']} graphs held, pool {runner['pool_bytes'] / mib:.0f} MiB, staging "
            f"{runner['staging_bytes'] / mib:.0f} MiB, held {runner['bytes_held'] / mib:.0f} MiB; peak reserved "
            f"{bench['peak_reserved_bytes'] / mib:.0f} MiB; captures {runner['captures']} took "
            f"{runner['capture_seconds']:.1f} s, verification {runner['verify_seconds']:.2f} s."
        )
    else:
        lines.append("Bench ran no graphs (no GPU, or bench failed).")
    section = document["sections"]["graph_memory"]
    data = section.get("data")
    lines.append("")
    if isinstance(data, dict) and data.get("rows"):
        lines.append(f"bench-memory, mixed stream, budget {data['budget_bytes'] / 2**20:.0f} MiB:")
        lines.append("")
        met = {True: "yes", False: "**NO**", None: ""}
        lines += _table(
            ["metric", "value", "target", "met"],
            [[r["metric"], r["value"], r["target"], met[r["met"]]] for r in data["rows"]],
        )
        if "memory.png" in document["plots"]:
            lines += ["", "![graph memory](memory.png)"]
    else:
        lines += _not_there(section)
    return lines


def _graph_admission(document: dict[str, Any]) -> list[str]:
    from rocm_vit.workloads.traffic import sighting_lines

    section = document["sections"]["graph_admission"]
    data = section.get("data")
    if not (isinstance(data, dict) and data.get("streams")):
        return _not_there(section)
    lines = [
        "`rocm-vit bench-traffic --mode tower`: each call all-eager and under the serving defaults (a fresh "
        "runner per stream) back to back, wall ms, each capture's time charged to the calls behind it; the "
        "second half is the runner once warm. Share: of what a graph of each call's own layout, captured for "
        "free, would save (replays timed on sampled calls), what the defaults realized on the mean.",
        "",
    ]
    rows = []
    for stream in data["streams"]:
        for name, compared in ((stream["stream"], stream), ("second half", stream["second_half"])):
            eager, graphs, share = compared["eager"], compared["graphs"], compared["share"]
            rows.append(
                [
                    name,
                    f"{graphs['replays']} / {graphs['captures']}",
                    f"{eager['mean_ms']:.2f} / {eager['p90_ms']:.2f}",
                    f"{graphs['mean_ms']:.2f} / {graphs['p90_ms']:.2f}",
                    f"{graphs['mean_ms'] / eager['mean_ms']:.3f}x / {graphs['p90_ms'] / eager['p90_ms']:.3f}x",
                    "-" if share is None else f"{share:.0%}",
                    f"{stream['launch_ms']:.1f}",
                ]
            )
    header = ["stream", "replays / captures", "eager mean / p90", "graphs mean / p90", "graphs / eager", "share",
              "launch ms learned"]  # fmt: skip
    sightings = sighting_lines(data)
    return lines + _table(header, rows) + (["", *(f"- {line}" for line in sightings)] if sightings else [])


def _logs(document: dict[str, Any]) -> list[str]:
    lines = ["Every part's stdout and stderr (attach the folder, or the file of a part that failed):", ""]
    for key, section in document["sections"].items():
        parts = section["checks"].items() if key == "hazards" else [(key, section)]
        for name, part in parts:
            logs = (part.get("part") or part).get("logs") or {}
            if logs:
                lines.append(f"- {name}: `{logs['stdout']}`, `{logs['stderr']}`")
    return lines


def _graph_pick(document: dict[str, Any], bench: dict[str, Any]) -> tuple[Callable[[dict], bool] | None, str]:
    """Whether the policy replays a bench row (a layout seen twice): within max tokens, where its cost
    model predicts a saving at this host's launch time, from the smallest layout's eager call and replay."""
    from rocm_vit.graphs.cost import MIN_SAVING_SHARE, CostModel, launch_from_call
    from rocm_vit.models import preset
    from rocm_vit.workloads.workload import parse_layouts, segment_lengths

    doctor = document["sections"]["doctor"].get("data") or {}
    try:
        max_tokens = int(doctor["policy"]["graph_runner"]["max_tokens"])
        terms = {name: doctor["policy"]["graph_cost"][name] for name in CostModel.__dataclass_fields__}
        config = preset(bench["preset"])
    except (TypeError, KeyError, ValueError):
        return None, ""
    smallest = min((row for row in bench["rows"] if "graph_ms" in row), key=lambda row: row["patches"])
    launch_ms = launch_from_call(smallest["eager_ms"], smallest["graph_ms"])
    model = CostModel(**terms).for_blocks(config.depth).with_launch_ms(launch_ms)

    def saves(row: dict) -> bool:
        (workload,) = parse_layouts(row["layout"], config)
        seq_lens = segment_lengths(workload.grid_thw)
        return row["patches"] <= max_tokens and model.capturable_saving_ms(seq_lens) > 0

    why = (
        f"The policy replays a layout called often enough (twice, and until the savings predicted for its calls "
        f"repay a fifth of a capture), up to {max_tokens} patches, where its cost model predicts a "
        f"saving of at least {MIN_SAVING_SHARE:.0%} at this host's launch time ({launch_ms:.1f} ms, from the "
        "smallest layout's eager call and replay); its pick is in bold."
    )
    return saves, why


def _not_there(section: dict[str, Any]) -> list[str]:
    detail = section.get("detail") or "no result"
    return [f"{section['status']}:", "", "```text", detail.rstrip(), "```"]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    escape = lambda cell: str(cell).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(escape(cell) for cell in row) + " |" for row in rows]
    return lines


def _seconds(section: dict[str, Any]) -> str:
    return f"{section['seconds']:.0f}" if section.get("seconds") else "-"


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""
