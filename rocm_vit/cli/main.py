"""The ``rocm-vit`` command: one argparse parser, one module per subcommand.

Each module in ``SUBCOMMANDS`` exposes ``add_arguments(parser)`` and ``run(args) -> int`` and imports heavy
dependencies inside ``run``. Invariant: one that fails to import reports it when run; the others work.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from rocm_vit import __version__

logger = logging.getLogger(__name__)

# subcommand -> (module, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("rocm_vit.cli.doctor", "report platform, versions, the resolved policy and settings"),
    "bench": ("rocm_vit.cli.bench", "time a tower from a preset over a sweep of image layouts"),
    "verify": ("rocm_vit.cli.verify", "check graph output against eager on this machine"),
    "bench-rope": ("rocm_vit.cli.bench_rope", "time the rotary implementations"),
    "bench-attn": ("rocm_vit.cli.bench_attention", "time the attention backends"),
    "bench-memory": (
        "rocm_vit.cli.bench_memory",
        "graph runner defaults under serving streams: hit rate, bytes held, latency",
    ),
    "bench-traffic": (
        "rocm_vit.cli.bench_traffic",
        "graph admission on serving streams: share of the possible saving realized, p90 against all-eager",
    ),
    "bench-sglang": (
        "rocm_vit.cli.bench_sglang",
        "SGLang's own Qwen3-VL tower: eager, SGLang's ViT graphs, rocm-vit's plugin, side by side",
    ),
    "tune": ("rocm_vit.cli.tune", "measure this GPU and write the profile the policy loads"),
    "report": ("rocm_vit.cli.report", "check this stack's hazards and write report.md for a bug report"),
}


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), set up logging and run the chosen subcommand."""
    argv = list(sys.argv[1:] if argv is None else argv)
    _setup_logging(_count_verbose(argv))
    args = build_parser().parse_args(argv)
    return args.run(args)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand whose module can be found."""
    parser = argparse.ArgumentParser(
        prog="rocm-vit",
        description="Fast, exact Qwen3-VL vision encoders under HIP/CUDA graphs.",
    )
    parser.add_argument("--version", action="version", version=f"rocm-vit {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        _register(subparsers, name, module_name, help_text)
    return parser


def _register(subparsers: argparse._SubParsersAction, name: str, module_name: str, help_text: str) -> None:
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name != module_name:
            _register_broken(subparsers, name, module_name, help_text, err)
        else:
            logger.debug("rocm-vit %s: %s does not exist; subcommand not registered", name, module_name)
        return
    except Exception as err:  # a broken subcommand module must not break the others
        _register_broken(subparsers, name, module_name, help_text, err)
        return
    subparser = subparsers.add_parser(name, help=help_text, description=help_text)
    module.add_arguments(subparser)
    with contextlib.suppress(argparse.ArgumentError):  # accept -v after the subcommand too
        subparser.add_argument("-v", "--verbose", action="count", default=0, help=argparse.SUPPRESS)
    subparser.set_defaults(run=module.run)


def _register_broken(
    subparsers: argparse._SubParsersAction, name: str, module_name: str, help_text: str, err: Exception
) -> None:
    logger.warning("rocm-vit %s is unavailable: importing %s failed: %s", name, module_name, err)
    # No option prefixes: whatever the user passed is swallowed, so the import error is what they see.
    subparser = subparsers.add_parser(name, help=f"{help_text} (unavailable)", prefix_chars="\0", add_help=False)
    subparser.add_argument("ignored", nargs="*", help=argparse.SUPPRESS)
    subparser.set_defaults(run=_unavailable(name, module_name, err))


def _unavailable(name: str, module_name: str, err: Exception) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        print(f"rocm-vit {name}: cannot import {module_name}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1

    return run


def _count_verbose(argv: Sequence[str]) -> int:
    """``-v`` flags anywhere in ``argv``, so logging is set up before subcommand modules import."""
    count = 0
    for arg in argv:
        if arg == "--":
            break
        if arg == "--verbose":
            count += 1
        elif arg.startswith("-") and not arg.startswith("--") and set(arg[1:]) == {"v"}:
            count += len(arg) - 1
    return count


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose <= 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
