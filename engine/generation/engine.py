"""Engine: a model with its tokenizer, and the one entry point to plain and DSpark (speculative) generation."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..dspark.config import DSparkConfig
from ..spec.errors import InputError
from .plain import generate
from .results import GenerationResult, StepInfo
from .speculative import generate_speculative
from .text_stream import TextStream


@dataclass
class TextGeneration:
    texts: list[str]             # decoded new text per prompt
    prompt_ids: list[list[int]]
    result: GenerationResult


class Engine:
    """A model with its tokenizer and Engram token map, loaded once; the app, the CLI, the model card and the
    benches generate through it. tokenizer may be None for a model driven by token ids only."""

    def __init__(self, model, tokenizer=None, source: str = ""):
        self.args, self.model, self.tokenizer, self.source = model.args, model, tokenizer, source

    @classmethod
    def load(cls, config=None, checkpoint=None, *, seed: int = 0, device: str = "cpu",
             dtype: torch.dtype = torch.float32, options=None) -> Engine:
        """config: ModelArgs, a config path or preset name (optional with a checkpoint that has config.json
        beside it). Without a checkpoint the weights are the seeded random initialisation."""
        from ..spec.config import ModelArgs, load_config
        from ..spec.presets import resolve_config
        from ..text.engram_map import model_token_map
        from ..text.tokenizer import load_tokenizer
        tokenizer = load_tokenizer()
        args = config if isinstance(config, ModelArgs) or config is None else resolve_config(str(config))
        if checkpoint is not None:
            from ..checkpoint.store import config_beside, id_map_beside, load_checkpoint
            from ..text.byte_fallback import ByteFallbackTokenizer
            args = args or load_config(config_beside(checkpoint))
            id_map = id_map_beside(checkpoint, tokenizer, args.vocab_size)
            token_map = model_token_map(args, tokenizer, id_map)
            if id_map is not None:  # a reduced vocabulary: model ids are not tokenizer ids
                tokenizer = ByteFallbackTokenizer(id_map)
            _, model = load_checkpoint(checkpoint, device, dtype=dtype, token_map=token_map, options=options,
                                       config=args)
            source = f"checkpoint {checkpoint}"
        else:
            if args is None:
                raise InputError("Engine.load: give a config (or a checkpoint with config.json beside it)")
            from ..model import Transformer, init_weights
            from ..speedups import prepare_for_inference
            model = Transformer(args, model_token_map(args, tokenizer), dtype=dtype, device=device, options=options)
            init_weights(prepare_for_inference(model), seed)
            source = f"random init (seed {seed})"
        model.eval()
        return cls(model, tokenizer, source)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return ([self.args.bos_token_id] if add_bos else []) + self.tokenizer.encode(text)

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, dspark: DSparkConfig | None = None,
                 **kwargs) -> GenerationResult:
        """Generate from token ids: plain decoding, or with dspark (a DSparkConfig) speculative decoding, whose
        result is a SpeculativeResult with DSpark metrics. The other keywords are those of
        engine.generation.plain.generate (sampling, seed, stop tokens, on_token, trace, cuda_graphs); the trace
        labels tokens with the tokenizer's text unless token_text is given."""
        if self.tokenizer is not None:
            kwargs.setdefault("token_text", self.tokenizer.token_text)
        if dspark is None:
            return generate(self.model, prompts, max_new_tokens=max_new_tokens, **kwargs)
        return generate_speculative(self.model, prompts, max_new_tokens=max_new_tokens, dspark=dspark, **kwargs)

    def generate_text(self, prompts: str | Sequence[str], *, max_new_tokens: int, add_bos: bool = True,
                      on_text: Callable[[int, str], None] | None = None, dspark: DSparkConfig | None = None,
                      **kwargs) -> TextGeneration:
        """Generate from text; on_text(row, piece) streams decoded text (whole characters only). dspark: a
        DSparkConfig to decode speculatively (the result is then a SpeculativeResult with DSpark metrics).
        cuda_graphs=True graphs the decode steps (with dspark: the target's verify forwards)."""
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        ids = [self.encode(t, add_bos) for t in texts]
        streams = [TextStream(self.tokenizer) for _ in texts]
        user_cb = kwargs.pop("on_token", None)

        def on_token(row: int, token: int, info: StepInfo) -> None:
            piece = streams[row].push(token)
            if on_text is not None and piece:
                on_text(row, piece)
            if user_cb is not None:
                user_cb(row, token, info)

        result = self.generate(ids, max_new_tokens=max_new_tokens, on_token=on_token, dspark=dspark, **kwargs)
        return TextGeneration([self.tokenizer.decode(t) for t in result.tokens], ids, result)
