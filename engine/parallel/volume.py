"""Communication per decode token of the tensor/expert-parallel layout, counted from a config (no model is built)."""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.config import ModelArgs


@dataclass(frozen=True)
class Collective:
    """One kind of collective a decode step runs: `count` of them per token, each over `payload` bytes (the
    tensor every rank contributes to an all-reduce; the full gathered tensor of an all-gather)."""
    what: str
    op: str            # "all_reduce" | "all_gather"
    count: int
    payload: int

    def sent_per_rank(self, ranks: int) -> float:
        """Bytes each rank sends with the ring algorithm: 2(n−1)/n of the payload for an all-reduce
        (reduce-scatter, then all-gather), (n−1)/n for an all-gather."""
        share = (ranks - 1) / ranks
        return self.count * self.payload * (2 * share if self.op == "all_reduce" else share)


def decode_collectives(args: ModelArgs, batch: int = 1, act_bytes: int = 2) -> list[Collective]:
    """The collectives of one plain decode step of `batch` tokens (engine.parallel's layout; the trace off):
    the vocabulary-parallel embedding (one all-reduce of [B, dim] activations), per layer the attention's
    row-parallel wo_b (an all-reduce of [B, dim] activations) and the expert-parallel MoE (an all-reduce of the
    fp32 [B, dim] routed sum), and the head's all-gather of the fp32 logits [B, V]. act_bytes: 2 for bf16
    activations (the reference's GPU dtype), 4 for an fp32 model."""
    hidden = batch * args.dim
    return [Collective("embed (vocabulary-parallel)", "all_reduce", 1, hidden * act_bytes),
            Collective("attn.wo_b (row-parallel)", "all_reduce", args.n_layers, hidden * act_bytes),
            Collective("ffn routed experts (expert-parallel, fp32)", "all_reduce", args.n_layers, hidden * 4),
            Collective("head logits (vocabulary-parallel, fp32)", "all_gather", 1, batch * args.vocab_size * 4)]


def volume_lines(args: ModelArgs, ranks: int, act_bytes: int = 2) -> list[str]:
    """A table of decode_collectives per token and its totals, for a reader who wants the cost of a run."""
    rows = decode_collectives(args, 1, act_bytes)
    lines = [f"{args.name or 'model'} at tensor/expert parallel {ranks}, one decode token (batch 1), "
             f"activations {8 * act_bytes}-bit:",
             f"  {'collective':44s} {'op':10s} {'count':>5s} {'bytes each':>11s} {'sent/rank':>10s}"]
    for c in rows:
        lines.append(f"  {c.what:44s} {c.op:10s} {c.count:5d} {c.payload:11,d} {c.sent_per_rank(ranks):10,.0f}")
    total = sum(c.count * c.payload for c in rows)
    sent = sum(c.sent_per_rank(ranks) for c in rows)
    lines.append(f"  total: {sum(c.count for c in rows)} collectives, {total / 2**20:.2f} MiB of payload, "
                 f"{sent / 2**20:.2f} MiB sent per rank (ring)")
    return lines
