"""Work off the block stack's critical path, run on a second stream so it overlaps the blocks.

Invariants: eager and capture take the same path (fork and join become graph edges); results do not
depend on the stream; ``record_stream`` guards cross-stream reads. The policy decides (CUDA only,
as measured in 1583dcf).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rocm_vit.graphs.torch_graphs import prime_blas
from rocm_vit.policy import active_policy


class SideStream:
    """Launches independent work on an extra stream and joins it back; one side stream per main stream.

    Never shared across main streams: a thread's eager launch would land in another thread's capture.
    """

    def __init__(self, new_stream: Callable[[torch.device], torch.cuda.Stream] = torch.cuda.Stream) -> None:
        self._new_stream = new_stream
        self._streams: dict[tuple[torch.device, int], torch.cuda.Stream] = {}

    def launch(self, fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``fn(x)``, on the side stream where enabled; read the result only after ``join``."""
        if not x.is_cuda or not active_policy().side_stream.value:
            return fn(x)
        main = torch.cuda.current_stream(x.device)
        side = self._stream(x.device, main)
        side.wait_stream(main)  # x is complete before the side stream reads it
        with torch.cuda.stream(side):
            out = fn(x)
        x.record_stream(side)  # the main stream does not reuse x's memory before the side read it
        return out

    def prepare(self, device: torch.device) -> None:
        """Make the side stream and its BLAS workspaces before a capture's warm-up, outside the graph pool."""
        if device.type != "cuda" or not active_policy().side_stream.value:
            return
        main = torch.cuda.current_stream(device)
        if (device, main.cuda_stream) in self._streams:
            return
        with torch.cuda.stream(self._stream(device, main)):
            prime_blas(device)

    def join(self, outputs: list[torch.Tensor]) -> None:
        """Make the current stream wait for the side stream, which produced ``outputs``."""
        cuda_outputs = [out for out in outputs if out.is_cuda]
        if not cuda_outputs or not active_policy().side_stream.value:
            return
        device = cuda_outputs[0].device
        main = torch.cuda.current_stream(device)
        main.wait_stream(self._stream(device, main))
        for out in cuda_outputs:
            out.record_stream(main)  # read, and later freed, on the main stream

    def _stream(self, device: torch.device, main: torch.cuda.Stream) -> torch.cuda.Stream:
        key = (device, main.cuda_stream)
        stream = self._streams.get(key)
        if stream is None:
            # setdefault: two threads may ask at once; both must get the same stream.
            stream = self._streams.setdefault(key, self._new_stream(device))
        return stream
