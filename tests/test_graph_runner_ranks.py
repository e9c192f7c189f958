"""Two ranks whose allocators report different pool sizes take the same graph decisions (gloo, CPU).

Each rank runs its own ViTGraphRunner over the same calls with a stand-in mechanism; rank 1's pools
read 24 KiB larger, as two allocators can disagree. With ``agree_max`` over the group both ranks must
capture, evict, release and refuse alike, call for call; without it (the control) they must not,
or the scenario would prove nothing.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from rank_exit import leave_without_finalizing

from rocm_vit.graphs.ranks import group_max

sys.path.insert(0, str(Path(__file__).resolve().parent))

pytestmark = pytest.mark.slow

WORLD_SIZE = 2
POOL_BYTES_OFFSET = 24 << 10


def _rank(rank: int, store_path: str, report_dir: str, agree: bool) -> None:
    import test_graph_runner as support
    from test_graph_store import _churn

    from rocm_vit.attention import get_backend
    from rocm_vit.graphs import ViTGraphRunner
    from rocm_vit.graphs.options import RunnerOptions

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD_SIZE)
    try:
        generator = torch.Generator().manual_seed(0)
        mechanism = support.StandInGraphs(
            scratch_bytes_per_token=64, segment_bytes=2 << 10, pool_bytes_offset=rank * POOL_BYTES_OFFSET
        )
        runner = ViTGraphRunner(
            support._toy_forward_blocks,
            get_backend("sdpa").layout_args,
            RunnerOptions(min_hits=1, capacity=8, max_tokens=2048, budget_bytes=320 << 10),
            mechanism=mechanism,
            agree_max=group_max() if agree else None,
        )
        decisions = []
        for layout in _churn(generator, 300, seed=5):
            before = runner.stats()
            support._run_checked(runner, layout, generator)
            after = runner.stats()
            counters = ("captures", "replays", "evictions", "pool_releases")
            eager = [reason for reason, count in after["eager_runs"].items() if count > before["eager_runs"][reason]]
            decisions.append([after[name] - before[name] for name in counters] + eager)
        Path(report_dir, f"rank{rank}.json").write_text(json.dumps(decisions))
    finally:
        dist.destroy_process_group()
    leave_without_finalizing()


def _decisions(tmp_path: Path, agree: bool) -> list[list]:
    report_dir = tmp_path / ("agreed" if agree else "alone")
    report_dir.mkdir()
    mp.start_processes(
        _rank, args=(str(tmp_path / f"store-{agree}"), str(report_dir), agree), nprocs=WORLD_SIZE, start_method="spawn"
    )
    return [json.loads((report_dir / f"rank{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


@pytest.mark.skipif(not dist.is_available(), reason="this torch has no torch.distributed")
def test_ranks_whose_allocators_disagree_take_the_same_decisions(tmp_path: Path) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    first, second = _decisions(tmp_path, agree=True)
    assert first == second
    assert sum(call[3] for call in first) > 0 and sum(call[2] for call in first) > 0  # releases, evictions
    first, second = _decisions(tmp_path, agree=False)
    assert first != second  # the control: alone, the ranks part ways
