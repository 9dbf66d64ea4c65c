"""`python -m engine bench`: prefill/decode tokens/s and the trace overhead, measured in one run."""
from __future__ import annotations

import argparse
import json

from ..bench.results_file import ResultsRecorder
from ..request.schedules import SCHEDULES
from ..spec.errors import InputError
from ..spec.presets import resolve_config
from .arg_checks import check_at_least, check_at_most, check_device, check_seed, check_threads
from .run_args import DTYPES, add_experts_argument, apply_threads, check_experts

HELP = "measure prefill and decode tokens/s and the trace overhead (random-init or checkpoint weights)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config.json path or preset name (default: the config beside --checkpoint, "
                                          "else tiny-v4.1)")
    parser.add_argument("--checkpoint",
                        help="time this checkpoint's weights instead of random init: the project's safetensors or an "
                             "official FP8/FP4 folder, kept quantized (under torchrun each rank reads only its shard); "
                             "the plain rows only")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="weights and activations of the plain and --compile rows (default float32; bfloat16 "
                             "keeps the tensors the reference holds in fp32, such as the head, in fp32)")
    add_experts_argument(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--results", metavar="OUT",
                        help="also write that object as a results file, with the command, date, commit, machine and "
                             "load (docs/results/engine_bench.json)")
    parser.add_argument("--gpu", action="store_true",
                        help="add the GPU section: Triton kernels vs PyTorch, launches per decode step, "
                             "decode tokens/s with and without kernels, and the bandwidth floor "
                             "(CUDA; on CPU only under TRITON_INTERPRET=1)")
    parser.add_argument("--kernel-config", help="config whose widths the per-kernel timings use (default: --config)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="add decode tokens/s through CUDA graphs (engine.graphs; on the CPU an eager replay "
                             "of the same static decode body) next to the plain forward")
    parser.add_argument("--compile", action="store_true",
                        help="add decode tokens/s of the static decode body through torch.compile (inductor), next to "
                             "the eager forward, and the first step's compile time (minutes on a small CPU the first "
                             "time; inductor caches on disk)")
    parser.add_argument("--dspark", action="store_true",
                        help="add DSpark on/off rows: tokens/s ratio, tokens per target forward, mean accepted length")
    parser.add_argument("--schedule", choices=tuple(SCHEDULES), default="all",
                        help="DSpark schedule for the --dspark rows (default all)")


def run(args: argparse.Namespace) -> int:
    # loads torch: the CLI imports every command module for its help line, so only when this runs
    from ..parallel.world import main_rank_output
    with main_rank_output():  # under torchrun, only rank 0 prints (engine.parallel)
        return bench(args)


def bench(args: argparse.Namespace) -> int:
    # the benches load torch: the CLI imports every command module for its help line
    import torch

    from ..bench.cpu import compiled_decode_rates, compiled_rate_lines, run_bench
    from ..bench.dspark import run_dspark_bench
    from ..bench.gpu import graph_decode_rates, graph_rate_lines, run_gpu_bench
    from ..checkpoint.store import config_beside
    from ..generation import Engine
    from ..kernels.runtime import unavailable_reason
    from ..model import EngineOptions
    from ..parallel import launched_size
    from ..parallel.world import is_main_process

    check_threads(args.threads)
    check_device(args.device)
    apply_threads(args.threads)
    if launched_size() > 1 and (getattr(args, "gpu", False) or getattr(args, "cuda_graphs", False)):
        raise InputError("--gpu and --cuda-graphs measure one process; under torchrun, bench measures the plain "
                         "(and --dspark) rows")
    checkpoint = getattr(args, "checkpoint", None)
    extra_rows = [flag for flag, on in (("--gpu", "gpu"), ("--cuda-graphs", "cuda_graphs"), ("--compile", "compile"),
                                        ("--dspark", "dspark")) if getattr(args, on, False)]
    if checkpoint and extra_rows:
        raise InputError(f"--checkpoint times the plain rows; {', '.join(extra_rows)} build random-init models of "
                         "their own: run them without --checkpoint")
    if not args.config:
        args.config = str(config_beside(checkpoint)) if checkpoint else "tiny-v4.1"
    check_arguments(args, resolve_config(args.config))
    experts = getattr(args, "experts", "device")
    check_experts(experts, getattr(args, "cuda_graphs", False) or getattr(args, "compile", False))
    if experts == "host" and (launched_size() > 1 or getattr(args, "gpu", False)):
        raise InputError("--experts host measures one process with the routed experts on the host: not under "
                         "torchrun (expert parallelism splits them over the ranks) nor with --gpu (its kernel rows "
                         "hold every weight on the device)")
    options = EngineOptions(experts=experts)
    if getattr(args, "gpu", False):
        reason = unavailable_reason(args.device)
        if reason is not None:
            raise InputError(f"--gpu on {args.device}: {reason}")
    recorder = ResultsRecorder(getattr(args, "results", None), "engine_bench", "-m engine")   # command: sys.argv's
    dtype = getattr(torch, args.dtype)
    model = None
    if checkpoint:
        model = Engine.load(resolve_config(args.config), checkpoint, device=args.device, dtype=dtype,
                            options=options).model
    result = run_bench(resolve_config(args.config), batch=args.batch, prompt_len=args.prompt_len,
                       new_tokens=args.new_tokens, repeats=args.repeats, seed=args.seed, device=args.device,
                       dtype=dtype, options=options, model=model)
    gpu = None
    if getattr(args, "gpu", False):
        kernel_args = resolve_config(args.kernel_config) if args.kernel_config else None
        gpu = run_gpu_bench(resolve_config(args.config), kernel_args=kernel_args, device=args.device,
                            batch=args.batch, repeats=20, seed=args.seed)
    graphs = None
    if getattr(args, "cuda_graphs", False):
        graphs = graph_decode_rates(resolve_config(args.config), batch=args.batch, prompt_len=args.prompt_len,
                                    steps=max(args.new_tokens - 1, 3), seed=args.seed, device=args.device)
    compiled = None
    if getattr(args, "compile", False):
        compiled = compiled_decode_rates(resolve_config(args.config), batch=args.batch, prompt_len=args.prompt_len,
                                         steps=max(args.new_tokens - 1, 3), seed=args.seed, device=args.device,
                                         dtype=dtype)
    spec = None
    if getattr(args, "dspark", False):
        spec = run_dspark_bench(resolve_config(args.config), schedule=args.schedule, batch=args.batch,
                                prompt_len=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats,
                                seed=args.seed, device=args.device, options=options)
    out = result.to_dict() if gpu is None else {**result.to_dict(), "gpu": gpu.to_dict()}
    out = out if graphs is None else {**out, "cuda_graphs": graphs}
    out = out if compiled is None else {**out, "compile": compiled}
    out = out if spec is None else {**out, "dspark": spec.to_dict()}
    if is_main_process():   # under torchrun, rank 0 writes the results file
        recorder.write([out], torch.get_num_threads())
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print("\n".join(result.lines() + ([] if gpu is None else gpu.lines()) +
                        ([] if graphs is None else graph_rate_lines(graphs)) +
                        ([] if compiled is None else compiled_rate_lines(compiled)) +
                        ([] if spec is None else spec.lines())))
    return 0


def check_arguments(args: argparse.Namespace, model_args) -> None:
    """The sizes and the seed, named by flag, before a model is built (the config bounds batch and length)."""
    check_seed(args.seed)
    check_at_least(args.batch, 1, "--batch")
    check_at_most(args.batch, model_args.max_batch_size, "--batch", "the config's max_batch_size")
    check_at_least(args.prompt_len, 1, "--prompt-len")
    check_at_least(args.new_tokens, 2, "--new-tokens")  # the first comes from the prefill; decode needs one more
    check_at_least(args.repeats, 1, "--repeats")
    check_at_most(args.prompt_len + args.new_tokens, model_args.max_seq_len, "--prompt-len + --new-tokens",
                  "the config's max_seq_len")
