"""Engine: a model with its tokenizer, and the one entry point to plain and DSpark (speculative) generation."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..checkpoint.official_layout import official_folder
from ..checkpoint.store import config_beside, id_map_beside, load_checkpoint
from ..model import Transformer, init_weights
from ..model.options import EngineOptions
from ..parallel import build_shard
from ..parallel.settings import lockstep_settings
from ..parallel.world import World, join_world, launched_size
from ..placement import build_model, prepare_model
from ..plan.memory_fit import check_model_fits, check_split_fits
from ..request import GenerationRequest
from ..spec.config import ModelArgs, load_config
from ..spec.errors import InputError
from ..spec.presets import resolve_config
from ..text.byte_fallback import ByteFallbackTokenizer
from ..text.engram_map import model_token_map
from ..text.prompt_text import check_prompt_text, check_text
from ..text.tokenizer import Tokenizer, load_tokenizer
from .plain import generate
from .results import GenerationResult, OnToken, StepInfo
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

    missing_drafter: str | None = None   # why the config's drafter was not loaded (the CLI shows it), or None

    def __init__(self, model: Transformer, tokenizer: Tokenizer | None = None, source: str = "", *,
                 missing_drafter: str | None = None) -> None:
        self.args, self.model, self.tokenizer, self.source = model.args, model, tokenizer, source
        self.missing_drafter = missing_drafter

    @classmethod
    def load(cls, config: ModelArgs | str | Path | None = None, checkpoint: str | Path | None = None, *,
             seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32,
             options: EngineOptions | None = None, experts: str | None = None) -> Engine:
        """config: ModelArgs, a config path or preset name (optional with a checkpoint that has config.json
        beside it). Without a checkpoint the weights are the seeded random initialisation. experts: where the
        routed experts live, "device" or "host" (host memory, run on the host's CPU: engine.placement; one
        process only); None keeps options.experts (default "device"). A checkpoint without the drafter its config
        lists (a transformers folder) gives the backbone, and `missing_drafter` says why."""
        if experts is not None:
            options = replace(options or EngineOptions(), experts=experts)
        host_experts = options is not None and options.experts == "host"
        if host_experts and launched_size() > 1:
            raise InputError("--experts host runs in one process (one GPU + host RAM); under torchrun the routed "
                             "experts are split over the ranks instead (expert parallelism): launch without "
                             "torchrun, or leave out --experts host")
        world = join_world(device)  # None in one process; under torchrun: this rank (model sharded, engine.parallel)
        args = config if isinstance(config, ModelArgs) or config is None else resolve_config(str(config))
        if checkpoint is not None and args is None:
            args = load_config(config_beside(checkpoint))
        if args is not None:  # first, before the tokenizer and any weight: refuse what cannot fit
            _refuse_if_too_big(args, world, device, dtype, checkpoint, host_experts)
        tokenizer = load_tokenizer()
        if checkpoint is not None:
            id_map = id_map_beside(checkpoint, tokenizer, args.vocab_size)
            token_map = model_token_map(args, tokenizer, id_map)
            if id_map is not None:  # a reduced vocabulary: model ids are not tokenizer ids
                tokenizer = ByteFallbackTokenizer(id_map)
            if world is not None:
                model = build_shard(args, world, checkpoint=checkpoint, token_map=token_map, dtype=dtype,
                                    options=options)
            else:
                _, model = load_checkpoint(checkpoint, device, dtype=dtype, token_map=token_map, options=options,
                                           config=args)
            source = f"checkpoint {checkpoint}"
            missing_drafter = _missing_drafter(args, model.args, checkpoint)
        else:
            if args is None:
                raise InputError("Engine.load: give a config (or a checkpoint with config.json beside it)")
            if world is not None:
                model = build_shard(args, world, token_map=model_token_map(args, tokenizer), seed=seed, dtype=dtype,
                                    options=options)
            else:
                model = build_model(args, model_token_map(args, tokenizer), dtype=dtype, device=device,
                                    options=options)
                init_weights(prepare_model(model), seed)
            source = f"random init (seed {seed})"
            missing_drafter = None
        if world is not None:
            source += f", split over {world.size} ranks"
        model.eval()
        return cls(model, tokenizer, source, missing_drafter=missing_drafter)

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

    def generate(self, prompts: Sequence[Sequence[int]], request: GenerationRequest, *,
                 on_token: OnToken | None = None, token_text: Callable[[int], str] | None = None) -> GenerationResult:
        """Generate from token ids: plain decoding, or with request.dspark (a DSparkConfig) speculative decoding, whose
        result is a SpeculativeResult with DSpark metrics (engine.generation.plain.generate and
        engine.generation.speculative.generate_speculative). The trace labels tokens with the tokenizer's text
        unless token_text is given. A model split over ranks (torchrun) takes the request every rank agrees on
        (engine.parallel.settings.lockstep_settings)."""
        if token_text is None and self.tokenizer is not None:
            token_text = self.tokenizer.token_text
        if getattr(self.model, "world", None) is not None:  # every rank must take the same steps
            request = lockstep_settings(request, self.model.world)
        if request.dspark is None:
            return generate(self.model, prompts, request, on_token=on_token, token_text=token_text)
        return generate_speculative(self.model, prompts, request, on_token=on_token, token_text=token_text)

    def generate_text(self, prompts: str | Sequence[str], request: GenerationRequest, *, add_bos: bool = True,
                      on_text: Callable[[int, str], None] | None = None,
                      on_token: OnToken | None = None) -> TextGeneration:
        """Generate from text, as generate does from ids; on_text(row, piece) streams decoded text (whole
        characters only), on_token(row, token, info) each token as it is committed."""
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        ids = [self.encode_prompt(t, add_bos, f"prompt {i}") for i, t in enumerate(texts)]
        streams = [TextStream(self.tokenizer) for _ in texts]

        def on_each_token(row: int, token: int, info: StepInfo) -> None:
            piece = streams[row].push(token)
            if on_text is not None and piece:
                on_text(row, piece)
            if on_token is not None:
                on_token(row, token, info)

        result = self.generate(ids, request, on_token=on_each_token)
        return TextGeneration([self.tokenizer.decode(t) for t in result.tokens], ids, result)


def _missing_drafter(config: ModelArgs, built: ModelArgs, checkpoint: str | Path) -> str | None:
    """Why the model lacks the drafter its config lists (a transformers folder, which saves no `mtp.*` weights:
    engine.checkpoint.hf_layout), or None when nothing is missing."""
    if not config.n_draft_stages or built.n_draft_stages:
        return None
    kind = "DSpark" if config.has_dspark else "MTP"
    return (f"drafter absent: {checkpoint} holds no mtp.* weights for the {config.n_draft_stages} {kind} draft "
            "stage(s) its config lists (transformers saves none); the backbone is loaded, DSpark speculative "
            "decoding is unavailable")


def _refuse_if_too_big(args: ModelArgs, world: World | None, device: str, dtype: torch.dtype,
                       checkpoint: str | Path | None = None, host_experts: bool = False) -> None:
    """In one process every weight lands on `device`: refuse a model whose weights cannot fit there before
    allocating any (engine.plan.memory_fit; a quantized official checkpoint leaves its Engram tables on disk).
    With the routed experts on the host and a GPU device, the experts must fit the host's memory and the rest the
    GPU's. Under torchrun each rank holds only its shard (engine.parallel), so the check is left to the memory plan."""
    if world is not None:
        return
    free = None
    if str(device).startswith("cuda"):
        try:
            free = (torch.cuda.mem_get_info(torch.device(device))[0], f"free memory on {device}")
        except (RuntimeError, AssertionError):  # no such GPU: left to the device check that follows
            return
    official = checkpoint is not None and official_folder(checkpoint) is not None
    if host_experts and free is not None:
        check_split_fits(args, dtype.itemsize, official, free)
    else:
        check_model_fits(args, dtype.itemsize, official, free)
