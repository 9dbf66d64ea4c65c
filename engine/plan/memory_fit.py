"""Whether a model's weights fit in the memory this process may use, checked before any is allocated (no torch)."""
from __future__ import annotations

import os
from math import prod
from typing import TYPE_CHECKING

from ..accounting.accounting import GIB, account, kind_of
from ..accounting.inventory import inventory_tuple
from ..spec.errors import InputError

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

QUANTIZED_DTYPES = ("F8_E4M3", "F8_E8M0", "I8")  # kept as stored by the quantized official loader
DEQUANTIZED_AT_LOAD = ".attn.wo_a."               # spec §2.4: held in the compute dtype
ROUTED_EXPERTS = ".ffn.experts."                  # layers.L.ffn.experts.E.* and mtp.K.ffn.experts.E.*


def resident_bytes(args: "ModelArgs", bytes_per_value: int, official: bool = False) -> int:
    """Bytes the engine allocates for the weights of `args` (vision excluded: the engine does not run it).

    official=False (random init, or a plain bf16/fp32 checkpoint): every parameter in the compute dtype,
    the accounting's total_params × bytes_per_value. official=True (the quantized lazy loader,
    engine.checkpoint.official_load): FP8 / FP4 weights and their E8M0 scales as stored, wo_a dequantized to
    the compute dtype, other float tensors in the compute dtype, and the Engram tables not at all: they stay
    memory-mapped in the shard files and only the rows a token hashes to are read (the page cache may hold
    them; the process does not allocate them)."""
    if not official:
        return account(args).total_params * bytes_per_value
    return sum(_held(t, bytes_per_value) for t in inventory_tuple(args) if kind_of(t.name) != "engram_tables")


def routed_expert_bytes(args: "ModelArgs", bytes_per_value: int, official: bool = False) -> int:
    """The part of resident_bytes the routed experts hold (the MoE layers' and the drafter's `mtp.*` ones): what the
    host-experts placement (engine.placement) keeps in host memory."""
    experts = [t for t in inventory_tuple(args) if ROUTED_EXPERTS in t.name]
    if not official:
        return sum(t.params for t in experts) * bytes_per_value
    return sum(_held(t, bytes_per_value) for t in experts)


def _held(t, bytes_per_value: int) -> int:
    """Bytes the quantized official loader allocates for one stored tensor (Engram tables aside)."""
    if DEQUANTIZED_AT_LOAD in t.name:
        return t.params * bytes_per_value  # the scale (params 0) is folded into the weight
    if t.dtype in QUANTIZED_DTYPES:
        return t.nbytes
    return prod(t.shape) * (8 if t.dtype == "I64" else bytes_per_value)


def available_memory() -> tuple[int, str]:
    """(bytes, what bounds them): the least of the memory the kernel can give without swapping, what the
    process's cgroup limit leaves, and what its address-space limit (ulimit -v) leaves."""
    found = []
    meminfo = _read_kib("/proc/meminfo", "MemAvailable:")
    if meminfo is not None:
        found.append((meminfo, "MemAvailable in /proc/meminfo"))
    elif hasattr(os, "sysconf") and "SC_AVPHYS_PAGES" in os.sysconf_names:
        found.append((os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "free physical memory"))
    limit, used = _read_int("/sys/fs/cgroup/memory.max"), _read_int("/sys/fs/cgroup/memory.current")
    if limit is not None and used is not None:
        found.append((max(limit - used, 0), "the cgroup memory limit (memory.max)"))
    soft = _address_space_limit()
    if soft is not None:
        mapped = _read_kib("/proc/self/status", "VmSize:") or 0
        found.append((max(soft - mapped, 0), "the address-space limit (ulimit -v) left to this process"))
    if not found:
        raise InputError("cannot tell how much memory is available on this system (no /proc/meminfo or sysconf)")
    return min(found)


def lower_bound(args: "ModelArgs", bytes_per_value: int, official: bool = False) -> int:
    """A closed-form part of resident_bytes — routed experts, embedding and head, Engram tables unless official —
    that costs no inventory walk, so that a model far too large is refused in milliseconds."""
    a = args
    draft_experts = a.draft_n_routed_experts if a.has_dspark else a.n_routed_experts
    expert_params = (a.n_layers * a.n_routed_experts + a.n_draft_stages * draft_experts) * 3 * a.dim * a.moe_inter_dim
    stored = a.expert_dtype or a.dtype
    expert_bytes = expert_params * {"fp4": 1, "fp8": 2}[stored] // 2 if official and stored in ("fp4", "fp8") \
        else expert_params * bytes_per_value
    tables = 0 if official else sum(a.engram_num_embeddings) * a.engram_head_dim * bytes_per_value
    return expert_bytes + 2 * a.vocab_size * a.dim * bytes_per_value + tables


def check_model_fits(args: "ModelArgs", bytes_per_value: int, official: bool = False,
                     available: tuple[int, str] | None = None) -> int:
    """Raise InputError naming the model, the estimate and the memory available when the weights cannot fit
    (available: (bytes, source) of the target device; default: this host's available_memory()). Returns the
    estimate: resident_bytes, or lower_bound when that alone is too much. Only the weights are counted:
    caches and activations come on top."""
    have, source = available or available_memory()
    need, about = lower_bound(args, bytes_per_value, official), "at least"
    if need <= have:
        need, about = resident_bytes(args, bytes_per_value, official), "about"
    if need > have:
        how = ("FP8/FP4 weights as stored, Engram tables left in the shard files" if official else
               f"every parameter in {bytes_per_value} B")
        raise InputError(f"model '{args.name or args.model_type or 'from the config'}' needs {about} "
                         f"{_gib(need)} for its weights ({how}), but only {_gib(have)} is available ({source}); "
                         "refused before allocating. Use a smaller config (such as tiny-v4.1) or a machine with "
                         "more memory" + ("" if official else ", or load a quantized official-format checkpoint"))
    return need


def check_split_fits(args: "ModelArgs", bytes_per_value: int, official: bool,
                     device_free: tuple[int, str]) -> None:
    """The host-experts placement's check_model_fits: the routed experts against this host's available_memory(),
    everything else against device_free ((bytes, source) of the GPU). InputError naming the part that does not
    fit, before any weight is allocated."""
    experts = routed_expert_bytes(args, bytes_per_value, official)
    rest = resident_bytes(args, bytes_per_value, official) - experts
    name = args.name or args.model_type or "from the config"
    for need, (have, source), part in ((rest, device_free, "everything but its routed experts"),
                                       (experts, available_memory(), "its routed experts, kept in host memory")):
        if need > have:
            raise InputError(f"model '{name}' with --experts host needs about {_gib(need)} for {part}, but only "
                             f"{_gib(have)} is available ({source}); refused before allocating")


def _gib(n: int) -> str:
    return f"{n / GIB:,.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:,.1f} MiB"


def _address_space_limit() -> int | None:
    try:
        import resource  # Unix only: imported where the limit is read, so the check runs elsewhere too
    except ImportError:  # not a Unix
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def process_memory(field: str) -> int | None:
    """This process's `field` of /proc/self/status (VmRSS, VmHWM, RssAnon, ...) in bytes; None where there is none."""
    return _read_kib("/proc/self/status", field + ":")


def _read_kib(path: str, field: str) -> int | None:
    """A `Field:  123 kB` line of a /proc file, in bytes."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> int | None:
    """A file holding one integer (a cgroup counter); None if absent or 'max'."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None
