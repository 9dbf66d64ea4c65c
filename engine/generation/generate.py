"""Generation: prefill each prompt into its cache row, then batched decode with per-row positions."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..model.sampling import SamplingParams, draw, make_generators, probabilities
from ..text.tokenizer import Tokenizer
from ..trace.trace import Trace

EOS_ID = 1


@dataclass(frozen=True)
class StepInfo:
    """What the on_token callback learns with each token."""
    step: int            # 0 = the token chosen from the prefill logits
    pos: int             # the position the token occupies
    time_s: float        # wall time of the forward that produced it
    prob: float          # its probability under the distribution it was drawn from


@dataclass
class GenerationResult:
    tokens: list[list[int]]                 # new tokens per prompt (stop tokens not included)
    finish_reasons: list[str]               # "stop" | "length" | "max_seq_len" per prompt
    prompt_lengths: list[int]
    prefill_s: float = 0.0                  # all prompts' prefill forwards
    decode_s: float = 0.0                   # all batched decode forwards
    step_times: list[float] = field(default_factory=list)  # one per decode forward

    @property
    def n_new_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def prefill_tokens_per_s(self) -> float:
        return sum(self.prompt_lengths) / self.prefill_s if self.prefill_s > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        """New tokens after the first of each row (those came from prefill) per second of decode."""
        decoded = sum(max(len(t) - 1, 0) for t in self.tokens)
        return decoded / self.decode_s if self.decode_s > 0 else float("nan")


OnToken = Callable[[int, int, StepInfo], None]


def check_prompts(prompts: Sequence[Sequence[int]], vocab_size: int, max_seq_len: int) -> list[list[int]]:
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("generate: prompts must be a non-empty list of token-id lists")
    out = []
    for i, p in enumerate(prompts):
        ids = [int(t) for t in p]
        if not ids:
            raise ValueError(f"generate: prompt {i} is empty; give at least one token (e.g. BOS = 0)")
        if len(ids) > max_seq_len:
            raise ValueError(f"generate: prompt {i} has {len(ids)} tokens, more than the model's "
                             f"max_seq_len of {max_seq_len}")
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"generate: prompt {i} has token id(s) {bad[:5]} outside 0..{vocab_size - 1}")
        out.append(ids)
    return out


@torch.inference_mode()
def generate(model, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float = 0.0,
             top_k: int = 0, top_p: float = 1.0, seed: int | Sequence[int] | None = None,
             stop_tokens: Sequence[int] = (EOS_ID,), on_token: OnToken | None = None, trace: Trace | None = None,
             token_text: Callable[[int], str] | None = None, cuda_graphs: bool = False) -> GenerationResult:
    """Generate up to max_new_tokens per prompt. Row i samples with seed + i (or seed[i]), so a prompt's
    output does not depend on its batch companions. token_text labels tokens in the trace. cuda_graphs:
    decode steps go through an engine.graphs.GraphedDecoder (CUDA graphs per batch bucket on a GPU; on
    the CPU the same static body runs eagerly); prefill stays eager."""
    args = model.args
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"generate: max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    params = SamplingParams(float(temperature), top_k, float(top_p))
    prompts = check_prompts(prompts, args.vocab_size, args.max_seq_len)
    n = len(prompts)
    seeds = _row_seeds(seed, n)
    device = next(model.parameters()).device
    generators = make_generators(seeds, device)
    stop = {int(t) for t in stop_tokens}
    text_of = token_text or (lambda t: "")
    max_len = min(args.max_seq_len, max(len(p) for p in prompts) + max_new_tokens)
    # with graphs, one extra cache row takes the padding rows of a batch bucket
    cache = model.new_cache(n + 1 if cuda_graphs else n, max_len)
    decoder = None
    if cuda_graphs:
        from ..graphs import GraphedDecoder
        decoder = GraphedDecoder(model, cache, scratch_row=n)
    result = GenerationResult([[] for _ in prompts], [""] * n, [len(p) for p in prompts])

    # Prefill: each prompt alone into its own cache row, so no padding enters any computation.
    last_logits, last_time = [], []
    for row, ids in enumerate(prompts):
        if trace is not None:
            trace.record_prompt(row, ids, [text_of(t) for t in ids])
        t0 = time.perf_counter()
        logits = model(torch.tensor([ids], device=device), cache, rows=torch.tensor([row], device=device),
                       trace=trace, logits="last")  # [1, V]
        last_time.append(_elapsed(t0, device))
        last_logits.append(logits)
    result.prefill_s = sum(last_time)
    if max_new_tokens == 0:
        result.finish_reasons = ["length"] * n
        return result

    active = list(range(n))
    logits = torch.cat(last_logits)  # [n, V]
    times = last_time
    for step in range(max_new_tokens):
        if params.greedy:
            chosen, probs = logits.argmax(-1), [1.0] * len(active)
        else:
            dist = probabilities(logits, params)  # [A, V]
            chosen = draw(dist, [generators[r] for r in active])
            probs = dist.gather(-1, chosen[:, None]).squeeze(-1).tolist()
        still = []
        for i, row in enumerate(active):
            token = int(chosen[i])
            pos = len(prompts[row]) + len(result.tokens[row])
            if token in stop:
                result.finish_reasons[row] = "stop"
                continue
            result.tokens[row].append(token)
            if trace is not None:
                trace.record_token(row, pos, token, text_of(token), step=step, step_time_s=times[i], logits=logits[i])
            if on_token is not None:
                on_token(row, token, StepInfo(step, pos, times[i], probs[i]))
            if len(result.tokens[row]) >= max_new_tokens:
                result.finish_reasons[row] = "length"
            elif pos + 1 >= args.max_seq_len:
                result.finish_reasons[row] = "max_seq_len"
            else:
                still.append(row)
        active = still
        if not active:
            break
        # Decode: the last token of every unfinished row, each at its own position.
        t0 = time.perf_counter()
        if decoder is not None:
            logits = decoder.step(torch.tensor([[result.tokens[r][-1]] for r in active]), active, trace)
        else:
            last = torch.tensor([[result.tokens[r][-1]] for r in active], device=device)  # [A, 1]
            logits = model(last, cache, rows=torch.tensor(active, device=device), trace=trace, logits="last")
        dt = _elapsed(t0, device)
        result.step_times.append(dt)
        result.decode_s += dt
        times = [dt] * len(active)
    return result


def _row_seeds(seed: int | Sequence[int] | None, n: int) -> list[int | None]:
    if seed is None:
        return [int(torch.randint(0, 2**62, ())) for _ in range(n)]
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    seeds = [int(s) for s in seed]
    if len(seeds) != n:
        raise ValueError(f"generate: {len(seeds)} seeds for {n} prompts")
    return seeds


def _elapsed(t0: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


@dataclass
class TextGeneration:
    texts: list[str]             # decoded new text per prompt
    prompt_ids: list[list[int]]
    result: GenerationResult


class Engine:
    """A model with its tokenizer and Engram token map, loaded once; the app and the CLI generate through it."""

    def __init__(self, args, model, tokenizer, source: str):
        self.args, self.model, self.tokenizer, self.source = args, model, tokenizer, source

    @classmethod
    def load(cls, config=None, checkpoint=None, *, seed: int = 0, device: str = "cpu",
             dtype: torch.dtype = torch.float32, options=None) -> "Engine":
        """config: ModelArgs, a config path or preset name (optional with a checkpoint that has config.json
        beside it). Without a checkpoint the weights are the seeded random initialisation."""
        from ..checkpoint.store import load_checkpoint
        from ..spec.presets import resolve_config
        from ..spec.config import ModelArgs, load_config
        from ..text.tokenizer import load_tokenizer
        tokenizer = load_tokenizer()
        args = config if isinstance(config, ModelArgs) or config is None else resolve_config(str(config))
        if checkpoint is not None:
            from ..checkpoint.store import config_beside, id_map_beside
            args = args or load_config(config_beside(checkpoint))
            id_map = id_map_beside(checkpoint, tokenizer, args.vocab_size)
            if id_map is not None:  # a reduced vocabulary: model ids are not tokenizer ids
                tokenizer = ByteFallbackTokenizer(id_map)
            args, model = load_checkpoint(checkpoint, device, dtype=dtype, token_map=_token_map(args, tokenizer),
                                          options=options, config=args)
            source = f"checkpoint {checkpoint}"
        else:
            if args is None:
                raise ValueError("Engine.load: give a config (or a checkpoint with config.json beside it)")
            from ..model import Transformer, init_weights
            model = Transformer(args, _token_map(args, tokenizer), dtype=dtype, device=device, options=options)
            init_weights(model, seed)
            source = f"random init (seed {seed})"
        model.eval()
        return cls(args, model, tokenizer, source)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([self.args.bos_token_id] if add_bos else []) + self.tokenizer.encode(text)

    def generate_text(self, prompts: str | Sequence[str], *, max_new_tokens: int, add_bos: bool = True,
                      on_text: Callable[[int, str], None] | None = None, dspark=None, **kwargs) -> TextGeneration:
        """Generate from text; on_text(row, piece) streams decoded text (whole characters only). dspark: a
        DSparkConfig to decode speculatively (the result is then a SpeculativeResult with DSpark metrics).
        cuda_graphs=True graphs the decode steps (with dspark: the target's verify forwards)."""
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        ids = [self.encode(t, add_bos) for t in texts]
        streams = [_TextStream(self.tokenizer) for _ in texts]
        user_cb = kwargs.pop("on_token", None)

        def on_token(row: int, token: int, info: StepInfo) -> None:
            piece = streams[row].push(token)
            if on_text is not None and piece:
                on_text(row, piece)
            if user_cb is not None:
                user_cb(row, token, info)

        run = generate
        if dspark is not None:
            from .speculative import generate_speculative as run
            kwargs["dspark"] = dspark
        result = run(self.model, ids, max_new_tokens=max_new_tokens, on_token=on_token,
                     token_text=self.tokenizer.token_text, **kwargs)
        return TextGeneration([self.tokenizer.decode(t) for t in result.tokens], ids, result)


class _TextStream:
    """Incremental detokenizer: emits new text once it no longer ends in a partial UTF-8 character."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.emitted = tokenizer, [], 0

    def push(self, token: int) -> str:
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece, self.emitted = text[self.emitted:], len(text)
        return piece


def _token_map(args, tokenizer):
    if not args.has_engram:
        return None
    from ..text.engram_map import lookup
    if isinstance(tokenizer, ByteFallbackTokenizer):
        # the real tokenizer's compression, restricted to the model's ids (checked on the full map)
        base = tokenizer.reduced_vocab.tokenizer
        full = lookup(args.replace(vocab_size=base.full_vocab_size), base)
        return tokenizer.reduced_vocab.engram_token_map(full)
    return lookup(args, tokenizer)


class ByteFallbackTokenizer(Tokenizer):
    """The tokenizer of a reduced-vocabulary checkpoint: ids are model ids (IdMap order), and encode spells
    tokens the model lacks with byte tokens instead of refusing them, so any text can be prompted."""

    def __init__(self, id_map):
        super().__init__(id_map.tokenizer.path, id_map=id_map.ids.tolist())
        self.reduced_vocab = id_map

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a str, got {type(text).__name__}")
        return self.reduced_vocab.encode(text)

