"""``python -m rocm_vit.cli.hazard_check NAME [--preset P] [--quick]``: one hazard check of
``rocm_vit.report.hazards`` with the real probes, its verdict printed as one line of JSON.
``rocm-vit report`` runs each check in a process of its own: a hazard may leave the GPU context unusable.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence

from rocm_vit.report.hazards import HAZARDS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rocm_vit.cli.hazard_check", description="one rocm-vit hazard check; its verdict as JSON"
    )
    parser.add_argument("name", choices=sorted(HAZARDS))
    parser.add_argument("--preset", default="qwen3-vl-8b")
    parser.add_argument("--quick", action="store_true", help="fewer rounds and layouts")
    args = parser.parse_args(argv)
    from rocm_vit.report import probes  # the device work: only in the check's own process

    verdict = probes.run_check(args.name, args.preset, args.quick)
    print(json.dumps(verdict.as_dict()), flush=True)
    return 0


if __name__ == "__main__":
    main()
    # Skip teardown: a destructor aborting over the probe's broken capture (ROCm) would crash the check.
    os._exit(0)
