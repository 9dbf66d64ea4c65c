"""Engine: a model with its tokenizer, and the one entry point to plain and DSpark (speculative) generation."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..dspark.config import DSparkConfig
from ..spec.errors import InputError
from ..spec.interventions import Intervention
from ..text.prompt_text import check_prompt_text, check_text
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
        from ..parallel.world import join_world
        from ..spec.config import ModelArgs, load_config
        from ..spec.presets import resolve_config
        from ..text.engram_map import model_token_map
        from ..text.tokenizer import load_tokenizer
        world = join_world(device)  # None in one process; under torchrun: this rank (model sharded, engine.parallel)
        args = config if isinstance(config, ModelArgs) or config is None else resolve_config(str(config))
        if checkpoint is not None and args is None:
            from ..checkpoint.store import config_beside
            args = load_config(config_beside(checkpoint))
        if args is not None:  # first, before the tokenizer and any weight: refuse what cannot fit
            _refuse_if_too_big(args, world, device, dtype, checkpoint)
        tokenizer = load_tokenizer()
        if checkpoint is not None:
            from ..checkpoint.store import id_map_beside, load_checkpoint
            from ..text.byte_fallback import ByteFallbackTokenizer
            id_map = id_map_beside(checkpoint, tokenizer, args.vocab_size)
            token_map = model_token_map(args, tokenizer, id_map)
            if id_map is not None:  # a reduced vocabulary: model ids are not tokenizer ids
                tokenizer = ByteFallbackTokenizer(id_map)
            if world is not None:
                from ..parallel import build_shard
                model = build_shard(args, world, checkpoint=checkpoint, token_map=token_map, dtype=dtype,
                                    options=options)
            else:
                _, model = load_checkpoint(checkpoint, device, dtype=dtype, token_map=token_map, options=options,
                                           config=args)
            source = f"checkpoint {checkpoint}"
        else:
            if args is None:
                raise InputError("Engine.load: give a config (or a checkpoint with config.json beside it)")
            from ..model import Transformer, init_weights
            from ..speedups import prepare_for_inference
            if world is not None:
                from ..parallel import build_shard
                model = build_shard(args, world, token_map=model_token_map(args, tokenizer), seed=seed, dtype=dtype,
                                    options=options)
            else:
                model = Transformer(args, model_token_map(args, tokenizer), dtype=dtype, device=device,
                                    options=options)
                init_weights(prepare_for_inference(model), seed)
            source = f"random init (seed {seed})"
        if world is not None:
            source += f", split over {world.size} ranks"
        model.eval()
        return cls(model, tokenizer, source)

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of any valid text (empty too); InputError for text that is no valid Unicode."""
        return ([self.args.bos_token_id] if add_bos else []) + self.tokenizer.encode(check_text(text, "the text"))

    def encode_prompt(self, text: str, add_bos: bool = True, label: str = "the prompt") -> list[int]:
        """Token ids of a prompt under the one prompt rule (engine.text.prompt_text: valid Unicode, not blank,
        refused by its length before tokenizing when it cannot fit), then refused when its tokens exceed the
        model's max_seq_len; label names the prompt in messages."""
        check_prompt_text(text, label, self.args.max_seq_len)
        ids = self.encode(text, add_bos)
        if len(ids) > self.args.max_seq_len:
            raise InputError(f"{label} has {len(ids):,} tokens, more than the model's max_seq_len of "
                             f"{self.args.max_seq_len}")
        return ids

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, dspark: DSparkConfig | None = None,
                 interventions: Sequence[Intervention | str] = (), **kwargs) -> GenerationResult:
        """Generate from token ids: plain decoding, or with dspark (a DSparkConfig) speculative decoding, whose
        result is a SpeculativeResult with DSpark metrics. The other keywords are those of
        engine.generation.plain.generate (sampling, seed, stop tokens, on_token, trace, cuda_graphs, compiled); the
        trace labels tokens with the tokenizer's text unless token_text is given. interventions: what-if changes
        (engine.spec.interventions, e.g. 'ban-expert:3:5@12'), checked against the config, applied to every forward
        of the run and recorded in the trace's meta."""
        kwargs["interventions"] = interventions
        if self.tokenizer is not None:
            kwargs.setdefault("token_text", self.tokenizer.token_text)
        if getattr(self.model, "world", None) is not None:  # every rank must take the same steps
            from ..parallel.settings import lockstep_settings
            kwargs = lockstep_settings(kwargs, self.model.world)
        if dspark is None:
            return generate(self.model, prompts, max_new_tokens=max_new_tokens, **kwargs)
        return generate_speculative(self.model, prompts, max_new_tokens=max_new_tokens, dspark=dspark, **kwargs)

    def generate_text(self, prompts: str | Sequence[str], *, max_new_tokens: int, add_bos: bool = True,
                      on_text: Callable[[int, str], None] | None = None, dspark: DSparkConfig | None = None,
                      interventions: Sequence[Intervention | str] = (), **kwargs) -> TextGeneration:
        """Generate from text; on_text(row, piece) streams decoded text (whole characters only). dspark: a
        DSparkConfig to decode speculatively (the result is then a SpeculativeResult with DSpark metrics).
        cuda_graphs=True graphs the decode steps, compiled=True runs them through torch.compile (with dspark: the
        target's verify forwards, the drafts and the auto schedule's plain steps). interventions: as for generate."""
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        ids = [self.encode_prompt(t, add_bos, f"prompt {i}") for i, t in enumerate(texts)]
        streams = [TextStream(self.tokenizer) for _ in texts]
        user_cb = kwargs.pop("on_token", None)

        def on_token(row: int, token: int, info: StepInfo) -> None:
            piece = streams[row].push(token)
            if on_text is not None and piece:
                on_text(row, piece)
            if user_cb is not None:
                user_cb(row, token, info)

        result = self.generate(ids, max_new_tokens=max_new_tokens, on_token=on_token, dspark=dspark,
                               interventions=interventions, **kwargs)
        return TextGeneration([self.tokenizer.decode(t) for t in result.tokens], ids, result)


def _refuse_if_too_big(args, world, device, dtype: torch.dtype, checkpoint=None) -> None:
    """In one process every weight lands on `device`: refuse a model whose weights cannot fit there before
    allocating any (engine.plan.memory_fit; a quantized official checkpoint leaves its Engram tables on disk).
    Under torchrun each rank holds only its shard (engine.parallel), so the check is left to the memory plan."""
    from ..checkpoint.official_layout import official_folder
    from ..plan.memory_fit import check_model_fits
    if world is not None:
        return
    free = None
    if str(device).startswith("cuda"):
        try:
            free = (torch.cuda.mem_get_info(torch.device(device))[0], f"free memory on {device}")
        except (RuntimeError, AssertionError):  # no such GPU: left to the device check that follows
            return
    check_model_fits(args, dtype.itemsize, checkpoint is not None and official_folder(checkpoint) is not None, free)
