"""SGLang's ``ViTCudaGraphRunner``, rebuilt on ``rocm_vit.graphs.ViTGraphRunner``.

``ViTGraphRunnerAdapter(vit)`` keeps SGLang 0.5.23's constructor and ``run`` signature, so SGLang's
models call it unchanged, and hands the blocks, merger and deepstack mergers to ``ViTGraphRunner``:
the segment offsets come from SGLang's host-side layout key (Qwen2.5-VL's window offsets too; its
``output_indices`` permutation is applied outside the graph), the limits from the
``SGLANG_VIT_CUDA_GRAPH_*`` settings, cos/sin stay in the dtype the model passed. What the runner
cannot serve (a backend that reads its offsets back, a call in another form, every call after a
failure) runs SGLang's eager block loop, never SGLang's own runner. Under tensor parallelism the ranks that
run the same ViT calls (``agreement_group``) agree on the all-reduce's plan and on every capture,
graphs are captured as the group's all-reduce needs (``all_reduce.plan_all_reduce``), no rank serves
eagerly a call its peers replay where the two do not pair, and a forward that may have launched
collectives is never re-run on one rank (docs/sglang.md, "Parallel serving"). What SGLang's runner
gets wrong, and so what this replaces: docs/sglang.md, "What the plugin changes".
"""

from __future__ import annotations

import functools
import logging
import weakref
from collections.abc import Callable, Hashable
from typing import Any

import torch
from torch import nn

from rocm_vit.graphs import GraphMechanism, ViTGraphRunner
from rocm_vit.graphs.forward import PeerReplayNotReady, ReplayLaunchFailed
from rocm_vit.graphs.ranks import AgreeMax, group_max
from rocm_vit.integrations.sglang.all_reduce import AllReducePlan, agreed_plan, plan_all_reduce
from rocm_vit.integrations.sglang.blocks import SGLANG_GRAPH_ARGS, SGLangBlocks, host_offsets, segment_args
from rocm_vit.integrations.sglang.contract import eager_unsupported_reason, unsupported_reason
from rocm_vit.integrations.sglang.imports import original
from rocm_vit.integrations.sglang.prepare import embed_patches
from rocm_vit.integrations.sglang.ranks import ForwardFailedUnderTP, RunnerFailures, agreement_group
from rocm_vit.integrations.sglang.start_calls import capture_tower_buckets, warm_up_tower
from rocm_vit.policy import Policy, active_policy, runner_options
from rocm_vit.settings import Settings, load_settings

logger = logging.getLogger(__name__)

_RUNNER_MODULE = "sglang.srt.multimodal.vit_cuda_graph_runner"

# Under tensor parallelism the ranks agree, once every this many calls, whether one of them failed
# inside rocm-vit; if one did, every rank hands the tower to SGLang's eager blocks at that same call.
_FAILURE_AGREEMENT_CALLS = 64

# Every adapter of this process, for the captures at server start (startup.py): SGLang builds them
# inside its towers' constructors and keeps no list of its own.
_ADAPTERS: weakref.WeakSet[ViTGraphRunnerAdapter] = weakref.WeakSet()


class ViTGraphRunnerAdapter:
    """Drop-in ``ViTCudaGraphRunner(vit)`` whose ``run`` delegates to ``rocm_vit.graphs.ViTGraphRunner``.

    ``vit`` is SGLang's vision tower: ``blocks`` (each with ``attn``, SGLang's ``VisionAttention``),
    ``merger`` and, for Qwen3-VL, ``deepstack_visual_indexes`` and ``deepstack_merger_list``. At
    construction every attribute and signature this adapter relies on is checked. A tower whose
    runner cannot be built, a call in another form, and every call after the first failure inside
    rocm-vit's runner (logged with its traceback) run SGLang's eager block loop: a request never
    fails because of rocm-vit. Only a tower whose blocks do not fit that loop either is left to
    SGLang's own runner, as without the plugin. ``mechanism`` replaces CUDA/HIP graphs (tests on a
    CPU pass a stand-in).
    """

    def __init__(self, vit: nn.Module, *, mechanism: GraphMechanism | None = None) -> None:
        self.vit = vit
        # SGLang's runner: only for a tower whose blocks do not fit the eager loop either.
        self._upstream = original(_RUNNER_MODULE, "ViTCudaGraphRunner")(vit)
        self._agree: AgreeMax | None = None  # over the ranks that run the same ViT calls, if several
        self._failures = RunnerFailures(None, _FAILURE_AGREEMENT_CALLS)
        self.all_reduce: AllReducePlan | None = None  # under tensor parallelism: how graphs capture its all-reduces
        self._stopped_stats: dict[str, Any] = {}  # the runner's last counters, once it stopped serving
        self._runner: ViTGraphRunner | None = None
        settings = _settings()
        self._graphs_on = settings.vit_cuda_graph  # else SGLang's eager forward serves, whatever runner is built
        self.captures_buckets_at_start = settings.vit_cuda_graph and settings.graph_capture_buckets
        _ADAPTERS.add(self)
        eager_problem = eager_unsupported_reason(vit)
        # The block loop rocm-vit serves the tower with: fused glue, or SGLang's own (settings.sglang_blocks).
        self._blocks = SGLangBlocks(vit, settings.sglang_blocks) if eager_problem is None else None
        problem = eager_problem or unsupported_reason(vit, self._upstream)
        if problem is None:
            self._runner, problem = self._build_runner(settings, mechanism)
        if not settings.vit_cuda_graph:
            return
        if problem is not None:
            served_by = "SGLang's eager blocks" if self._blocks is not None else "SGLang's own runner"
            logger.warning("rocm-vit graph runner: %s; %s serve %s", problem, served_by, type(vit).__name__)
        else:
            logger.info(
                "rocm-vit graph runner for %s: attention %s, at most %d graphs within %s, captured from the "
                "%d-th call of a layout up to %d patches",
                type(vit).__name__,
                vit.blocks[0].attn.qkv_backend_name,
                self._runner.capacity,
                "the device default budget"
                if settings.graph_memory_budget_mb is None
                else f"{settings.graph_memory_budget_mb} MiB",
                self._runner.min_hits,
                self._runner.max_tokens,
            )

    @property
    def shares_decisions(self) -> bool:
        """Whether other ranks run this tower's calls with this one (tensor parallelism): each of its
        forwards waits in collectives for theirs."""
        return self._agree is not None

    @property
    def serves_graphs(self) -> bool:
        """Whether rocm-vit's runner serves this tower (built, and no failure yet)."""
        return self._runner is not None

    def _build_runner(
        self, settings: Settings, mechanism: GraphMechanism | None
    ) -> tuple[ViTGraphRunner | None, str | None]:
        vit = self.vit
        backend = vit.blocks[0].attn.qkv_backend_name
        spec = SGLANG_GRAPH_ARGS.get(backend)
        if spec is None:
            return None, f"SGLang's {backend} attention cannot be captured as it reads its arguments back"
        # Qwen2.5-VL: blocks in fullatt_block_indexes attend within whole items, the others within
        # windows; its blocks take rotary as ``position_embeddings=(cos, sin)``.
        self._windowed = getattr(vit, "fullatt_block_indexes", None) is not None
        try:  # every backend of SGLANG_GRAPH_ARGS reads its offsets on the device alone: padding applies
            options = runner_options(_policy(), settings, len(vit.blocks), takes_device_offsets=True)
        except ValueError as error:  # RunnerOptions refuses the values
            return None, f"{error} (from the SGLANG_VIT_CUDA_GRAPH_* settings)"
        group = agreement_group(vit)
        capture_scope, agree_before_replay = None, False
        if group is not None:
            agree = group_max(group.cpu_group)
            plan = plan_all_reduce(vit, group, options.max_tokens)
            # Every rank builds its runner here, in the tower's constructor: graphs on, ranks agree.
            self.all_reduce = agreed_plan(plan, agree) if settings.vit_cuda_graph else plan
            if self.all_reduce.problem is not None:
                return None, self.all_reduce.problem
            options = options.with_max_tokens(self.all_reduce.max_tokens)
            capture_scope = self.all_reduce.capture_scope
            agree_before_replay = not self.all_reduce.pairs_eager_with_replay
            self._agree = agree
            self._failures = RunnerFailures(self._agree, _FAILURE_AGREEMENT_CALLS)
        runner = ViTGraphRunner(
            functools.partial(self._blocks.forward_blocks, spec, shares_collectives=group is not None),
            segment_args,
            options,
            mechanism=mechanism,
            agree_max=self._agree,
            capture_scope=capture_scope,
            agree_before_replay=agree_before_replay,
        )
        return runner, None

    def run(
        self,
        x: torch.Tensor,
        cu_seqlens: torch.Tensor,
        cu_window_seqlens: torch.Tensor | None,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None,
        rotary_pos_emb_cos: torch.Tensor | None = None,
        rotary_pos_emb_sin: torch.Tensor | None = None,
        output_indices: torch.Tensor | None = None,
        attention_layout_key: Hashable | None = None,
    ) -> torch.Tensor:
        """SGLang's ``ViTCudaGraphRunner.run``: blocks, merger and deepstack mergers over ``x`` ``[N, hidden]``.

        Qwen3-VL passes ``rotary_pos_emb_cos``/``_sin``; Qwen2.5-VL passes ``position_embeddings``,
        ``cu_window_seqlens`` and ``output_indices`` (the inverse window permutation, applied to the
        merged tokens). ``attention_layout_key`` (SGLang passes ``(full offsets, window offsets or
        None)`` as host tuples) supplies the segment offsets from the host; without it CPU tensors
        do, and device ones are read back once per call, as SGLang's runner does. Returns a tensor
        the caller owns.
        """
        upstream_args = (
            x,
            cu_seqlens,
            cu_window_seqlens,
            position_embeddings,
            rotary_pos_emb_cos,
            rotary_pos_emb_sin,
            output_indices,
            attention_layout_key,
        )
        if self._blocks is None:
            return self._upstream.run(*upstream_args)
        self._agree_on_failures()
        rotary = self._blocks.rotary(position_embeddings, rotary_pos_emb_cos, rotary_pos_emb_sin)
        fits = (
            self._runner is not None
            and rotary is not None
            and (cu_window_seqlens is not None) == self._windowed
            and (output_indices is None or self._windowed)
        )
        if not fits:
            return self._blocks.eager(*upstream_args)

        def replay() -> torch.Tensor:
            layout = self._blocks.layout(*host_offsets(cu_seqlens, cu_window_seqlens, attention_layout_key))
            merged = self._runner.run(x, layout, *rotary)
            return merged if output_indices is None else merged.index_select(0, output_indices)

        return self._served(replay, lambda: self._blocks.eager(*upstream_args))

    def run_embedding(
        self,
        pixels: torch.Tensor,
        embed_inputs: tuple[torch.Tensor, ...],
        cos: torch.Tensor,
        sin: torch.Tensor,
        cu_seqlens: torch.Tensor,
        offsets: tuple[int, ...],
    ) -> torch.Tensor:
        """``run`` for Qwen3-VL's graph path with its patch embedding and position add in the graph:
        ``pixels`` ``[N, patch]`` in the tower's dtype, ``embed_inputs`` what ``prepare.embed_patches``
        takes after them, ``offsets`` the host offsets of ``cu_seqlens``. ``cos``, ``sin`` and
        ``embed_inputs`` must never be written after the call (the per-layout cache's): a replay of
        the same layout copies them only once."""
        upstream_args = (cu_seqlens, None, None, cos, sin, None, (offsets, None))

        def eager() -> torch.Tensor:  # SGLang's eager blocks, or SGLang's runner where they do not fit
            x = embed_patches(self.vit, pixels, *embed_inputs)
            if self._blocks is None:
                return self._upstream.run(x, *upstream_args)
            return self._blocks.eager(x, *upstream_args)

        if self._blocks is None:
            return eager()
        self._agree_on_failures()
        rotary = self._blocks.rotary(None, cos, sin)
        if self._runner is None or rotary is None or self._windowed:
            return eager()

        def replay() -> torch.Tensor:
            return self._runner.run(pixels, self._blocks.layout(offsets, None), *rotary, *embed_inputs, immutable=True)

        return self._served(replay, eager)

    def _served(self, replay: Callable[[], torch.Tensor], eager: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``replay()`` through rocm-vit's runner; where it fails, what every rank must do instead."""
        try:
            return replay()
        except (ForwardFailedUnderTP, ReplayLaunchFailed) as failure:  # never re-run here alone: the call fails
            self._failures.failed()
            self._stop_serving()
            raise RuntimeError(
                f"rocm-vit graph runner: {type(self.vit).__name__}'s forward or replay raised on this rank after "
                "its collectives may have run; re-running it here alone would pair its all-reduces with the "
                "other ranks' next calls, so this call fails"
            ) from failure.__cause__
        except PeerReplayNotReady:  # another rank failed before the launch (and counts it): every rank runs eagerly
            return eager()
        except Exception:  # serving must go on: SGLang's eager blocks serve this call
            self._failures.failed()
            if self._agree is None:
                self._stop_serving()
                then = "from now on"
            else:  # the other ranks keep their runners until they agree to stop (_agree_on_failures)
                then = f"this call, and every rank's from their next agreement (<= {_FAILURE_AGREEMENT_CALLS} calls)"
            logger.exception("rocm-vit graph runner failed for %s; SGLang's eager blocks serve %s",
                             type(self.vit).__name__, then)  # fmt: skip
            # From the caller's untouched input: the runner never writes the tensors it is given, and
            # what failed launched no collective (a forward that raised is ForwardFailedUnderTP). Where
            # eager and replay do not pair, every rank's replay failed before its launch here alike.
            return eager()

    def _agree_on_failures(self) -> None:
        """Under tensor parallelism, every ``_FAILURE_AGREEMENT_CALLS``-th call: whether any rank's
        runner failed; if one did, every rank stops serving through its runner at this same call
        (``RunnerFailures``)."""
        if self._runner is None:
            return
        self._failures.before_call()
        if not self._failures.serving:
            logger.warning("rocm-vit graph runner of %s: a rank failed; every rank's calls run SGLang's eager blocks",
                           type(self.vit).__name__)  # fmt: skip
            self._stop_serving()

    def _stop_serving(self) -> None:
        self._failures.stop()
        if self._blocks is not None:
            self._blocks.use_sglang_blocks("rocm-vit's runner stopped serving after a failure")
        if self._runner is not None:
            self._stopped_stats = self._runner.stats()
        self._runner = None

    def capture_padded_buckets(self) -> int:
        """Capture now the graph of each bucket the runner pads one image or two to, through SGLang's
        own ``forward_with_cuda_graph`` (``start_calls.capture_tower_buckets``). Call it under the grad
        mode of the server's calls, or under ``torch.no_grad()``, whose tensors inference mode may
        write too. Returns how many graphs were captured: 0 where the runner pads nothing (padding
        off, Qwen2.5-VL's windows), stopped serving, or is not the one its tower holds (SGLang's
        forward reaches that one)."""
        runner = self._runner
        if runner is None or runner.padding is None or self._windowed or not self.held_by_its_tower():
            return 0
        # A runner that failed is dropped: SGLang's eager blocks serve from then on.
        return capture_tower_buckets(self.vit, runner, lambda: self._runner is runner)

    def held_by_its_tower(self) -> bool:
        """Whether SGLang's forward reaches this adapter: its tower holds it (``graph_runners``)."""
        return any(value is self for value in vars(self.vit).values())

    def warm_up(self) -> None:
        """An eager call of a random image through SGLang's own ``forward`` under ``no_grad`` and one
        under ``inference_mode`` (``start_calls.warm_up_tower``): what a request's eager call compiles
        compiles here instead. With rocm-vit's runner serving the tower the image is larger than it
        captures (``max_tokens``), so nothing is captured or counted towards a capture."""
        runner = self._runner if self._graphs_on else None
        warm_up_tower(self.vit, None if runner is None else runner.max_tokens)

    def stats(self) -> dict[str, Any]:
        """The rocm-vit runner's counters (captures, replays, evictions, eager runs by reason, bytes
        held), plus ``failures`` (calls rocm-vit failed and handed to SGLang) and ``stopped`` (after
        a failure, every call goes to SGLang) and ``blocks`` (which block loop runs, and why)."""
        stats = self._runner.stats() if self._runner is not None else dict(self._stopped_stats)
        blocks = None if self._blocks is None else self._blocks.blocks
        return {**stats, "failures": self._failures.count, "stopped": self._runner is None, "blocks": blocks}


def adapters_in(model: nn.Module) -> list[ViTGraphRunnerAdapter]:
    """The adapters serving the towers of ``model`` (each the one its tower holds), in the model's
    module order. Their start calls make the tower's collectives, so every rank of a group must make
    them in the same order: this process's set of adapters iterates in an order of its own, and an
    adapter its tower no longer holds serves nothing (seen under TP 2: one rank warmed up while the
    other captured a bucket, and gloo found the collectives' sizes differ)."""
    serving = {id(adapter.vit): adapter for adapter in list(_ADAPTERS) if adapter.held_by_its_tower()}
    return [serving[id(module)] for module in model.modules() if id(module) in serving]


def _policy() -> Policy | None:
    """The active policy, or ``None`` (the defaults) where a setting makes it fail: serving goes on."""
    try:
        return active_policy()
    except ValueError as error:
        logger.error("rocm-vit graph runner: %s; using the default max tokens and cost model", error)
        return None


def _settings() -> Settings:
    try:
        return load_settings()
    except ValueError as error:
        # Serving must not fail over a mistyped variable; the doctor reports it.
        logger.error("rocm-vit graph runner: %s; using the default settings", error)
        return Settings()
