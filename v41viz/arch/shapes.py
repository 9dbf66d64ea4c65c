"""The activation shapes the diagram's arrows carry, from the config: B batch, S tokens in this call, T tokens
in the cache so far, γ the draft block; every other size is the config's number."""
from __future__ import annotations

from engine.spec.config import ModelArgs
from engine.spec.roles import LayerRole

SYMBOLS = "B batch · S tokens in this call · T tokens cached so far · γ draft block"


def shape(*dims) -> str:
    """shape('B', 'S', 5120) → '[B, S, 5120]'."""
    return "[" + ", ".join(str(d) for d in dims) + "]"


class Shapes:
    """One config's activation shapes, named by what carries them; the strings the arrows and details show."""

    def __init__(self, args: ModelArgs):
        self.a = args

    # the residual stream and the sublayer inputs
    @property
    def ids(self) -> str:
        return shape("B", "S")

    @property
    def streams(self) -> str:
        return shape("B", "S", self.a.hc_mult, self.a.dim)

    @property
    def hidden(self) -> str:
        return shape("B", "S", self.a.dim)

    @property
    def logits(self) -> str:
        return shape("B", "S", self.a.vocab_size)

    # inside attention
    @property
    def q(self) -> str:
        return shape("B", "S", self.a.n_heads, self.a.head_dim)

    @property
    def q_latent(self) -> str:
        return shape("B", "S", self.a.q_lora_rank)

    @property
    def kv(self) -> str:
        return shape("B", "S", self.a.head_dim)

    def compressed_rows(self, ratio: int) -> str:
        return shape("B", "T" if ratio == 1 else f"T/{ratio}", self.a.head_dim)

    def index_keys(self, ratio: int) -> str:
        return shape("B", "T" if ratio == 1 else f"T/{ratio}", self.a.index_head_dim)

    @property
    def index_list(self) -> str:
        return shape("B", "S", self.a.index_topk)

    @property
    def window(self) -> str:
        return shape("B", self.a.window_size, self.a.head_dim)

    @property
    def grouped(self) -> str:
        return shape("B", "S", self.a.o_groups, self.a.o_lora_rank)

    def attended_rows(self, role: LayerRole) -> str:
        """How many K=V rows one query reads: its window, plus the index list (or every compressed row)."""
        if role.draft:
            return f"{self.a.window_size} ring + γ block rows"
        if not role.ratio:
            return f"{self.a.window_size} window rows"
        if role.indexer == "none":
            return f"{self.a.window_size} window + T/{role.ratio} compressed rows"
        return f"{self.a.window_size} window + {self.a.index_topk} compressed rows"

    # inside the MoE
    def routing(self, role: LayerRole) -> str:
        k = self.a.draft_n_activated_experts if role.draft else self.a.n_activated_experts
        return shape("B·S", k)

    @property
    def tokens_flat(self) -> str:
        return shape("B·S", self.a.dim)

    # the drafter
    @property
    def taps(self) -> str:
        return shape("B", "S", len(self.a.dspark_target_layer_ids) * self.a.dim)

    @property
    def draft_streams(self) -> str:
        return shape("B", "γ", self.a.hc_mult, self.a.dim)

    @property
    def draft_hidden(self) -> str:
        return shape("B", "γ", self.a.dim)

    @property
    def draft_logits(self) -> str:
        return shape("B", "γ", self.a.vocab_size)

    @property
    def markov_row(self) -> str:
        return shape("B", self.a.dspark_markov_rank)
