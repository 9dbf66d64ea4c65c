"""The only CUDA-specific step: warm a body up on a side stream, then capture it into a torch.cuda.CUDAGraph."""
from __future__ import annotations

import torch


def capture_cuda_graph(body, warmup: int = 2, what: str = "decode",
                       check: str = "engine.graphs.check_capture_safe(args)") -> "torch.cuda.CUDAGraph":
    """Capture body() (a function of static buffers only) as a graph; replay() reruns its launches.
    The warm-up calls (lazy cuBLAS/Triton initialisation, cached weight stacks) run on a side stream, as
    capture requires; the body must be idempotent for fixed inputs, which a decode step at fixed positions is."""
    if not torch.cuda.is_available():
        raise RuntimeError("CUDA graph capture needs a CUDA device; on CPU GraphedDecoder replays eagerly")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            body()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            body()
    except RuntimeError as e:  # typically "operation not permitted when stream is capturing": a host sync
        raise RuntimeError(f"CUDA graph capture of the {what} body failed ({e}); a host read has likely crept "
                           f"into the body: {check} names it on the CPU") from e
    return graph
