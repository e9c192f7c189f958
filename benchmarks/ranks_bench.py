"""Replay against eager per layout under tensor parallelism: TP 1, 2 and 4 on the same host.

SGLang's Qwen3-VL tower at Qwen3-VL-8B's sizes (random weights, bf16, ``triton_attn``), sharded as
SGLang shards it, one process a GPU over NCCL (tests/sglang_support/parallel.py, layouts
``bench_tp{N}``): each layout of ``parallel.BENCH_GRIDS`` through SGLang's eager forward and through
rocm-vit's graph (its all-reduces captured through SGLang's PyNccl), the median of 20 calls each.
A row's time is its slowest rank's (a request waits for every rank). NVLink multicast is off in every
rank. A TP size past this host's GPUs is left out, and said so. Prints a table last.

    python benchmarks/ranks_bench.py [--tp 1 2 4] [--out ranks_bench.json]

With ``--out``, the TP sizes a file of an earlier run holds stay in it and in the table, so that each
size can run in a command of its own (each within ten minutes).
Not run on GPUs yet: no result is recorded (docs/benchmarks.md).

(A script, run from the repository root with the checkout on PYTHONPATH.)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1] / "tests"
sys.path += [str(TESTS), str(TESTS / "sglang_support")]  # the rank harness the GPU rank tests run on
import parallel  # noqa: E402
import rank_harness  # noqa: E402

DEADLINE_S = 540


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--out", type=Path, default=None, help="every rank's rows, kept across runs (JSON)")
    args = parser.parse_args(argv)
    import torch

    gpus = torch.cuda.device_count()
    results: dict[int, list[dict]] = {}
    if args.out is not None and args.out.exists():
        results = {int(size): reports for size, reports in json.loads(args.out.read_text()).items()}
    left_out = [size for size in args.tp if size > gpus]
    for size in (size for size in args.tp if size <= gpus):
        with tempfile.TemporaryDirectory() as directory:
            out = Path(directory)
            worker_args = (size, f"file://{out / 'rendezvous'}", f"bench_tp{size}", str(out), "cuda")
            environment = rank_harness.rank_environment("cuda")
            rank_harness.spawn_ranks(parallel.worker, worker_args, size, DEADLINE_S, environment, out / "errors")
            results[size] = [json.loads((out / f"rank{rank}.json").read_text())["bench"] for rank in range(size)]
    if args.out is not None:
        args.out.write_text(json.dumps({str(size): reports for size, reports in results.items()}, indent=1))
    print(table(results))
    if left_out:
        print(f"not run: TP {', '.join(map(str, left_out))} (this host has {gpus} GPUs)")
    return 0


def table(results: dict[int, list[dict]]) -> str:
    """One row per layout and TP size: eager and graph ms (the slowest rank's), their ratio, the
    communicator, the card."""
    lines = [
        "| layout | patches | TP | eager ms | graph ms | eager / graph | replays | all-reduce | card |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    layouts = list(dict.fromkeys(name for reports in results.values() for name in reports[0]["rows"]))
    for name in layouts:
        for size, reports in sorted(results.items()):
            rows = [report["rows"][name] for report in reports]
            eager_ms = max(row["eager_ms"] for row in rows)
            graph_ms = max(row["graph_ms"] for row in rows)
            communicator = reports[0]["communicator"] or "-"
            lines.append(
                f"| {name} | {rows[0]['patches']} | {size} | {eager_ms:.3f} | {graph_ms:.3f} | "
                f"{eager_ms / graph_ms:.2f} | {min(row['replays'] for row in rows)} | {communicator} | "
                f"{reports[0]['device']} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
