"""`python -m engine generate`: stream generated text to stdout; optionally write a Trace file."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..request import GenerationRequest, SamplingParams
from ..request.interventions import MAX_INTERVENTIONS, check_interventions, parse_intervention
from ..request.request import PREFILL_CHUNK
from ..request.sampling import check_repetition, check_sampling
from ..request.schedules import SCHEDULES
from ..spec.config import load_config
from ..spec.errors import InputError
from ..spec.presets import resolve_config
from ..text.prompt_text import check_prompt_text
from ..trace import Trace, TraceBudget, trace_format
from .arg_checks import (
    check_at_least,
    check_at_most,
    check_device,
    check_fraction,
    check_output_file,
    check_seed,
    check_threads,
)
from .run_args import DTYPES, add_experts_argument, apply_threads, check_experts

DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[2] / "checkpoints" / "default"
HELP = "generate text from a prompt (random-init or checkpoint weights), optionally writing a trace"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="config.json path or preset name (default: the config beside --checkpoint)")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--checkpoint", help="safetensors file, or a directory with model.safetensors / an index; "
                                              "an official-format folder (FP8/FP4 shards, config.json with a "
                                              "quantization_config, e.g. from `engine quantize`) loads quantized "
                                              f"(default: the shipped {DEFAULT_CHECKPOINT.name}/ checkpoint)")
    weights.add_argument("--random-init", action="store_true", help="seeded random weights (needs --config)")
    parser.add_argument("--seed", type=int, default=0,
                        help="weight-init seed, and the sampling seed: 0..2**63-1 (default 0)")
    parser.add_argument("--prompt", required=True, help="prompt text (BOS is prepended unless --no-bos)")
    parser.add_argument("--no-bos", action="store_true", help="do not prepend the BOS token")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="(default 64)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 = greedy (default); sampling takes at least 1e-4 (below, logits / T overflow)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass to keep (1 = off)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, metavar="X",
                        help="CTRL-style penalty on every token already in the text (prompt + output): its logit is "
                             "divided by X when positive, multiplied when negative (1 = off, the default)")
    parser.add_argument("--no-repeat-ngram", type=int, default=0, metavar="N",
                        help="never emit a token that would repeat an N-gram already in the text (0 = off, the "
                             "default). Both apply to greedy and sampled decoding, and DSpark stays lossless")
    parser.add_argument("--trace", metavar="FILE", help="write a trace: .json, .parquet.zip or .safetensors")
    parser.add_argument("--trace-max-tokens", type=int, default=2048, help="token budget of the trace")
    parser.add_argument("--trace-attention", action="store_true", help="also record attention facts")
    parser.add_argument("--trace-lens", action="store_true",
                        help="also record the logit lens (each layer's top tokens) and the residual-stream RMS")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--dtype", choices=DTYPES, default="float32",
                        help="weights and activations (default float32); bfloat16 computes as the reference does, "
                             "rounding to bf16 where it does and keeping in fp32 what it keeps in fp32 (the head)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: small decode steps are many tiny ops, and extra "
                             "threads slow them down, badly so on a busy machine)")
    parser.add_argument("--dspark", action="store_true", help="decode speculatively with the DSpark drafter")
    parser.add_argument("--schedule", choices=tuple(SCHEDULES), default="all",
                        help="with --dspark: verify all drafts, cut at a confidence threshold, or the load-aware "
                             "scheduler (Alg. 1) with this machine's profiled throughput table, which also decodes "
                             "plainly while drafting does not pay (default all)")
    parser.add_argument("--threshold", type=float, default=0.5, help="confidence cut for --schedule threshold")
    add_experts_argument(parser)
    parser.add_argument("--kernels", choices=("torch", "triton"), default="torch",
                        help="triton: the fused Triton kernels for mHC seams, router, routed experts and Engram "
                             "(CUDA, or CPU under TRITON_INTERPRET=1); torch = the reference (default)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay decode steps as CUDA graphs (one per batch bucket); on the CPU the same static "
                             "decode body runs eagerly (same output, no speed-up). With --dspark: the target's verify "
                             "forwards (full γ + 1 blocks), the auto schedule's plain steps and the drafter")
    parser.add_argument("--compile", action="store_true",
                        help="run decode steps through torch.compile (inductor; with --dspark the verify, draft and "
                             "plain steps): several times faster on a CPU once compiled, but compiling takes minutes "
                             "the first time (cached on disk after); output equal up to float rounding")
    parser.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK, metavar="N",
                        help=f"prompt tokens per prefill forward (default {PREFILL_CHUNK}): a longer prompt runs in "
                             "consecutive chunks through the same cache, so its activations stay one chunk's "
                             "(`engine plan --prefill-chunk` sizes them alike)")
    parser.add_argument("--intervene", metavar="SPEC", action="append", default=[],
                        help="a what-if change, repeatable: engram-off:L, ban-expert:L:E, force-expert:L:E, "
                             "mhc-identity:L, no-candidate-filter, drop-stage:K (with --dspark), each optionally "
                             "@P (token position P only), @P-Q or @P- (positions, 0 = the first prompt token); "
                             "recorded in the trace. Not with --cuda-graphs or --compile")


def run(args: argparse.Namespace) -> int:
    # loads torch: the CLI imports every command module for its help line, so only when this runs
    from ..parallel.world import main_rank_output
    with main_rank_output():  # under torchrun, only rank 0 prints (engine.parallel)
        return generate_text(args)


def generate_text(args: argparse.Namespace) -> int:
    # the engine loads torch: the CLI imports every command module for its help line
    import torch

    from ..generation import DSparkConfig, Engine
    from ..kernels.runtime import unavailable_reason
    from ..model import EngineOptions
    from ..parallel.world import is_main_process

    if not args.random_init and not args.checkpoint:
        if not DEFAULT_CHECKPOINT.is_dir():
            raise InputError(f"no trained default checkpoint is shipped yet ({DEFAULT_CHECKPOINT} is missing): "
                             "pass --checkpoint DIR, or --random-init --config tiny-v4.1")
        args.checkpoint = str(DEFAULT_CHECKPOINT)
    if args.random_init and not args.config:
        raise InputError("--random-init needs --config (a config.json path or a preset name such as tiny-v4.1)")
    check_arguments(args)
    model_args = _model_config(args)
    interventions = _interventions(args, model_args)
    check_prompt_text(args.prompt, "--prompt", model_args.max_seq_len)  # a length no tokenization can fit
    check_at_most(args.max_new_tokens, model_args.max_seq_len - 1, "--max-new-tokens",
                  f"what the model's max_seq_len of {model_args.max_seq_len} leaves after a one-token prompt")
    apply_threads(args.threads)
    if args.cuda_graphs and not args.device.startswith("cuda"):
        print("--cuda-graphs on the CPU: the static decode body runs eagerly (no graph capture, no speed-up)",
              file=sys.stderr)
    options = None
    if args.kernels == "triton":
        reason = unavailable_reason(args.device)
        if reason is not None:
            raise InputError(f"--kernels triton on {args.device}: {reason}")
        options = EngineOptions(kernels="triton")
    engine = Engine.load(model_args, None if args.random_init else args.checkpoint, seed=args.seed,
                         device=args.device, dtype=getattr(torch, args.dtype), options=options, experts=args.experts)
    dspark = None
    if args.dspark:
        if engine.missing_drafter is not None:
            raise InputError(f"--dspark: {engine.missing_drafter}")
        if not engine.args.has_dspark:
            raise InputError(f"--dspark: config '{engine.args.name}' has no DSpark drafter (dspark_block_size is 0)")
        dspark = DSparkConfig.from_settings(args.schedule, args.threshold, engine.model, on_profiled=_announce_profile)
    trace = None
    if args.trace:
        trace = Trace(TraceBudget(max_tokens=args.trace_max_tokens, attention=args.trace_attention,
                                  lens=args.trace_lens),
                      meta={"config": engine.args.name, "weights": engine.source, "prompt": args.prompt,
                            "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p,
                            "repetition_penalty": args.repetition_penalty, "no_repeat_ngram": args.no_repeat_ngram,
                            "seed": args.seed, "dtype": args.dtype,
                            "dspark": args.schedule if args.dspark else "off",
                            # the model's sizes, so a replay or a Compare diff needs no loaded model (V4's
                            # hash-routed layers among them); the keys v41viz.inspect.trace_model reads
                            "n_routed_experts": engine.args.n_routed_experts,
                            "n_activated_experts": engine.args.n_activated_experts,
                            "engram_max_ngram_size": engine.args.engram_max_ngram_size,
                            "n_hash_layers": engine.args.n_hash_layers,
                            "vocab_size": engine.args.vocab_size})   # token ids are checked below it on load
    engine.encode_prompt(args.prompt, not args.no_bos, "--prompt")  # too many tokens: refused before any output
    where = args.device + (", routed experts on the host" if args.experts == "host" else "")
    print(f"[{engine.args.name or 'model'} · {engine.source} · {where}]", file=sys.stderr)
    if engine.missing_drafter is not None:
        print(f"[note: {engine.missing_drafter}]", file=sys.stderr)
    for iv in interventions:
        print(f"[intervention {iv.text}: {iv.describe()}]", file=sys.stderr)
    sys.stdout.write(args.prompt)
    sys.stdout.flush()

    def show(_row: int, piece: str) -> None:
        sys.stdout.write(piece)
        sys.stdout.flush()

    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.repetition_penalty,
                              args.no_repeat_ngram, args.seed)
    request = GenerationRequest(args.max_new_tokens, sampling, dspark=dspark, interventions=interventions,
                                trace=trace, cuda_graphs=args.cuda_graphs, compiled=args.compile,
                                prefill_chunk=args.prefill_chunk)
    out = engine.generate_text(args.prompt, request, add_bos=not args.no_bos, on_text=show)
    res = out.result
    print()
    print(f"prompt {res.prompt_lengths[0]} tokens: prefill {res.prefill_tokens_per_s:,.1f} tokens/s; "
          f"{res.n_new_tokens} new tokens ({res.finish_reasons[0]}): decode {res.decode_tokens_per_s:,.1f} tokens/s",
          file=sys.stderr)
    if dspark is not None:
        print("\n".join(res.metrics.lines()), file=sys.stderr)
        if res.plain_steps:
            print(f"  and {res.plain_steps} plain steps (no draft: the auto schedule judged drafting not to pay)",
                  file=sys.stderr)
    if trace is not None and is_main_process():  # every rank records the same trace; rank 0 writes it
        trace.save(args.trace)
        omitted = ", ".join(f"{k} {v}" for k, v in sorted(trace.omitted.items())) or "nothing"
        print(f"trace written to {args.trace} (left out: {omitted})", file=sys.stderr)
    return 0


def check_arguments(args: argparse.Namespace) -> None:
    """Every flag's value, before any work (the limits a config sets are checked once it is read)."""
    check_prompt_text(args.prompt, "--prompt")
    check_seed(args.seed)
    check_threads(args.threads)
    check_device(args.device)
    check_experts(args.experts, args.cuda_graphs or args.compile)
    check_at_least(args.max_new_tokens, 0, "--max-new-tokens")
    check_sampling(args.temperature, args.top_k, args.top_p, names=("--temperature", "--top-k", "--top-p"))
    check_repetition(args.repetition_penalty, args.no_repeat_ngram, names=("--repetition-penalty", "--no-repeat-ngram"))
    check_fraction(args.threshold, "--threshold")
    check_at_least(args.trace_max_tokens, 1, "--trace-max-tokens")
    if len(args.intervene) > MAX_INTERVENTIONS:
        raise InputError(f"--intervene is given {len(args.intervene):,} times; a run takes at most {MAX_INTERVENTIONS}")
    for spec in args.intervene:
        try:
            parse_intervention(spec)
        except InputError as e:
            raise InputError(f"--intervene: {e}") from None
    if args.intervene and (args.cuda_graphs or args.compile):
        raise InputError("--intervene runs on the eager decode path: leave out --cuda-graphs and --compile "
                         "(a captured or compiled step would not apply it)")
    if args.trace:
        try:
            trace_format(args.trace)  # an unknown suffix
        except InputError as e:
            raise InputError(f"--trace {e}") from None
        check_output_file(args.trace, "--trace")


def _model_config(args: argparse.Namespace):
    """The ModelArgs to load: --config, else the config.json beside --checkpoint."""
    # checkpoint.store loads torch: the CLI imports every command module for its help line
    from ..checkpoint.store import config_beside
    return resolve_config(args.config) if args.config else load_config(config_beside(args.checkpoint))


def _interventions(args: argparse.Namespace, model_args):
    """The --intervene specs checked against the model's config (drop-stage only with --dspark)."""
    try:
        checked = check_interventions(args.intervene, model_args)
    except InputError as e:
        raise InputError(f"--intervene: {e}") from None
    dropped = [iv.text for iv in checked if iv.kind == "drop-stage"]
    if dropped and not args.dspark:
        raise InputError(f"--intervene {dropped[0]}: drop-stage changes the DSpark drafter; add --dspark")
    return checked


def _announce_profile(path: Path) -> None:
    print(f"profiled steps/s by batch tokens into {path}", file=sys.stderr)
