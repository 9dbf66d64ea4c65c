"""Filling a built model from an official-format checkpoint by name: quantized tensors copied as stored, float
ones dequantized where the model keeps them in float, host-resident tables attached as RowSources."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..accounting.inventory import TensorSpec, inventory_tuple
from ..model import Transformer
from ..placement import allocate, prepare_model
from ..quant.apply import quantize_model
from ..quant.formats import dequantize_fp4, dequantize_fp8
from ..spec.config import ModelArgs, load_config
from .errors import CheckpointError
from .finite import check_finite, check_scale_range
from .official import FLOAT_TARGETS, TORCH_DTYPES, Located, OfficialCheckpoint
from .official_layout import CONFIG_NAME, QUANTIZED_CODES, scale_block, scale_name, weight_name
from .table_range import check_table_range
from .tensor_source import Source

if TYPE_CHECKING:
    from ..model import Transformer


@dataclass
class LoadPlan:
    """What loading an official checkpoint into one model reads: the state-dict names (those to dequantize
    into a float tensor among them) and, per host-resident module, the names it gets RowSources for."""
    stored: list[str]
    dequantized: set[str]
    host: dict[str, list[str]]


def plan_load(model: nn.Module, args: ModelArgs) -> LoadPlan:
    """The LoadPlan of `model` (built, possibly on the meta device: only names, dtypes and shapes are read).
    CheckpointError if a tensor of the model cannot take what the official layout stores under its name."""
    inventory = {t.name: t for t in inventory_tuple(args)}
    host = [prefix for prefix, m in model.named_modules() if getattr(m, "host_resident", False)]
    state = {n: t for n, t in model.state_dict().items() if not any(n.startswith(p + ".") for p in host)}
    dequantized, problems = _dequantized(state, inventory)
    if problems:
        raise CheckpointError(f"the model does not fit the official layout of its config: {'; '.join(problems[:8])}")
    host_names = {prefix: [n for n in inventory if n.rpartition(".")[0] == prefix] for prefix in host}
    return LoadPlan(list(state), dequantized, host_names)


def load_official(model: nn.Module, path: str | Path, *, args: ModelArgs | None = None,
                  plan: LoadPlan | None = None) -> dict[str, str]:
    """Fill `model` (default config: model.args) from the official-format checkpoint at `path` by name, reading
    only the tensors the model holds (fill_official says how). Returns the checkpoint's metadata."""
    ckpt = OfficialCheckpoint(path)
    args = args or model.args
    fill_official(model, ckpt, plan or plan_load(model, args), args)
    return ckpt.metadata()


def fill_official(model: nn.Module, ckpt: OfficialCheckpoint, plan: LoadPlan, args: ModelArgs,
                  source: Callable[[str], Source] = Source) -> None:
    """Fill `model` from `ckpt` as `plan` (plan_load of the whole model) says; engine.quant.apply describes the
    quantized model's side:
    * a tensor held in its stored dtype (a quantized linear's FP8 / packed-FP4 weight and E8M0 scale) is copied
      bit for bit; BF16 / F32 ones land in any float dtype;
    * a float tensor whose stored form is FP8 or FP4 gets the dequantized weight: `wo_a` (spec §2.4), or every
      weight of an unquantized reference model (the dequantized run the tests compare with);
    * every module with `host_resident = True` gets its tensors as RowSources: `module.attach(weight=…, scale=…)`.
    source(name): the stored tensor, and the part of it, that the model's tensor `name` holds: by default all of
    the tensor of that name; for a rank of engine.parallel its Layout.source, so that the rank reads only its
    rows, columns and experts (get_slice). A dequantized part reads the whole scale blocks around it.
    Every tensor's name, dtype and shape is checked (OfficialCheckpoint.locate) before anything is modified. The
    values are checked as they are copied, in the one pass that reads them (finite.py: NaN / Inf, NaN codes, scales
    that overflow their block, a dequantized weight after dequantization; table_range.py: hash-routing expert ids):
    a damaged tensor stops the load with CheckpointError and leaves the model partly filled (load_official_model
    discards it). Host-resident rows are checked as they are read (ShardRows)."""
    inventory = {t.name: t for t in inventory_tuple(args)}
    state = model.state_dict()
    host = tuple(prefix + "." for prefix in plan.host)
    reads: dict[str, tuple[str, Source, Source]] = {}   # stored name → (model name, part held, part read)
    scales: dict[str, Source] = {}                       # a dequantized part's scale blocks, by scale name
    for name in state:
        if name.startswith(host):
            continue
        held = source(name)
        read = held
        if held.name in plan.dequantized:
            spec = inventory[held.name]
            block = scale_block(held.name, spec.dtype, args)[held.dim or 0]
            read = held.whole_blocks(block, spec.shape[held.dim or 0])
            scales[scale_name(held.name)] = read.blocks(scale_name(held.name), block)
        reads[held.name] = (name, held, read)
    located = ckpt.locate([*reads, *scales, *(n for ns in plan.host.values() for n in ns)], inventory)
    with torch.no_grad():
        scale_parts = {n: t.clone() for n, t in ckpt.tensors({n: located[n] for n in scales}, parts=scales)}
        wanted = {n: located[n] for n in reads}
        for stored_name, stored in ckpt.tensors(wanted, parts={n: read for n, (_, _, read) in reads.items()}):
            name, held, read = reads[stored_name]
            if stored_name in plan.dequantized:
                stored = _dequantize(stored_name, stored, scale_parts.pop(scale_name(stored_name)),
                                     located[stored_name].spec, args)
                if held.dim is not None:   # the part held, out of its whole blocks
                    stored = stored.narrow(held.dim, held.start - read.start, held.stop - held.start)
            _check_values(stored_name, stored, located, state)
            state[name].copy_(stored)
            del stored  # drop the view so that the mapping's pages can go
    for prefix, names in plan.host.items():
        model.get_submodule(prefix).attach(**{n.rpartition(".")[2]: ckpt.row_source(located[n]) for n in names})


def load_official_model(path: str | Path, device: str | torch.device = "cpu", *, dtype: torch.dtype = torch.float32,
                        token_map=None, options=None, config: ModelArgs | str | Path | None = None,
                        quantized: bool = True) -> tuple[ModelArgs, Transformer]:
    """Build the model an official-format checkpoint describes (config: its config.json unless given) and load
    it. quantized: weights stay FP8 / FP4 in memory (engine.quant.apply.quantize_model; Engram tables stay
    memory-mapped on the host); False: an unquantized reference model with every weight dequantized at load.
    The model is built on the meta device and allocated once, in its final storage and place: no float copy of a
    quantized weight ever exists, and with options.experts "host" no routed expert touches the device
    (engine.placement). Then the speed transforms and the placement its options ask for (prepare_model)."""
    ckpt = OfficialCheckpoint(path)
    args = config if isinstance(config, ModelArgs) else load_config(config or ckpt.folder / CONFIG_NAME)
    if args.dtype != "fp8":
        raise CheckpointError(f"{ckpt.folder}: an official-format checkpoint needs a config with dtype fp8 "
                              f"(its quantization_config), got dtype {args.dtype!r}")
    model = Transformer(args, token_map, dtype=dtype, device="meta", options=options)
    if quantized:
        quantize_model(model, from_values=False)
    plan = plan_load(model, args)
    allocate(model, device)   # the routed experts in host memory when options.experts is "host"
    load_official(model, ckpt.folder, args=args, plan=plan)
    return args, prepare_model(model)


def _dequantized(state: dict[str, torch.Tensor], inventory: dict[str, TensorSpec]) -> tuple[set[str], list[str]]:
    """The float tensors to dequantize at load, and every way the model's tensors cannot hold the stored ones
    (names the layout lacks are left to OfficialCheckpoint.locate, which reports them)."""
    dequantized: set[str] = set()
    problems: list[str] = []
    for name, target in state.items():
        spec = inventory.get(name)
        if spec is None:
            continue
        stored = TORCH_DTYPES.get(spec.dtype)
        if stored == target.dtype or (spec.dtype in ("BF16", "F32") and target.dtype in FLOAT_TARGETS):
            want = spec.shape
        elif spec.dtype in QUANTIZED_CODES and target.dtype in FLOAT_TARGETS:
            dequantized.add(name)
            want = (spec.shape[0], 2 * spec.shape[1]) if spec.dtype == "I8" else spec.shape
        else:
            problems.append(f"the model holds '{name}' as {_short(target.dtype)}, which cannot take its stored "
                            f"{spec.dtype}")
            continue
        if tuple(target.shape) != want:
            problems.append(f"the model's '{name}' has shape {list(target.shape)}; "
                            f"the stored tensor needs {list(want)}")
    return dequantized, problems


def _check_values(name: str, stored: torch.Tensor, located: dict[str, Located],
                  state: dict[str, torch.Tensor]) -> None:
    """A tensor as the model holds it must be finite (a dequantized weight is checked after dequantization, which
    covers its scale), a routing table must name experts the model has, and a scale kept as stored must not
    overflow its weight's blocks."""
    where = str(located[name].shard)
    check_finite(stored, name, where)
    check_table_range(state, name, stored, where)
    if located[name].spec.is_scale and weight_name(name) in located:
        check_scale_range(stored, name, located[weight_name(name)].spec.dtype, where)


def _dequantize(name: str, stored: torch.Tensor, scale: torch.Tensor, spec: TensorSpec,
                args: ModelArgs) -> torch.Tensor:
    if spec.dtype == "I8":
        return dequantize_fp4(stored, scale)
    return dequantize_fp8(stored, scale, scale_block(name, spec.dtype, args))


def _short(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")
