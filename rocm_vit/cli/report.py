"""``rocm-vit report``: one command whose folder a user attaches to a bug report.

Writes ``report.md`` and ``report.json`` into ``--out`` (parts: ``rocm_vit.report.parts``). Invariants: no
network; nothing written outside the folder but ``tune``'s profile and compiler caches; exit status 1
when a part failed or the graph check found a mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from rocm_vit.models import preset_names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", choices=preset_names(), help="the tower you serve (default: qwen3-vl-8b on a GPU, tiny on a CPU)"
    )
    parser.add_argument("--out", type=Path, help="folder to write (default: ./rocm-vit-report-<date>-<time>)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="no tune, no bench-memory, no graph admission, fewer layouts (under 2 minutes on an H200)",
    )


def run(args: argparse.Namespace) -> int:
    from rocm_vit.report.collect import collect, exit_status
    from rocm_vit.report.render import to_markdown

    folder = args.out or Path(f"rocm-vit-report-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if folder.exists() and any(folder.iterdir()):
        print(f"rocm-vit report: {folder} exists and is not empty; name a new folder with --out", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    document = collect(args.preset, args.quick, folder, progress=_progress)
    (folder / "report.json").write_text(json.dumps(document, indent=1) + "\n")
    (folder / "report.md").write_text(to_markdown(document))
    for line in document["problems"]:
        print(f"  problem: {line.splitlines()[0]}", file=sys.stderr)
    print(f"rocm-vit report written to {folder}/report.md (and report.json, logs/): attach report.md to your issue")
    return exit_status(document)


def _progress(parts: list) -> Iterable:
    """The parts under a progress bar naming the one running (tqdm where installed, else one line each)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    if tqdm is None:
        for index, part in enumerate(parts, 1):
            print(f"[{index}/{len(parts)}] {part.title} ...", file=sys.stderr, flush=True)
            yield part
        return
    with tqdm(parts, desc="rocm-vit report", unit="part", file=sys.stderr) as bar:
        for part in bar:
            bar.set_postfix_str(part.title)
            yield part
