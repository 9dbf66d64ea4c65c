"""engine.speedups.sparse_rows: the rows sparse attention reads, by index_select, are the reference's rows."""
from __future__ import annotations

import pytest
import torch

from engine.model.attention import Attention
from engine.model.sparse_attn import gather_rows
from engine.speedups.fast_attention import FastAttention
from engine.speedups.sparse_rows import selected_rows


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("batch", [1, 3])
def test_selected_rows_are_the_reference_rows(batch, dtype):
    g = torch.Generator().manual_seed(batch)
    kv = torch.randn(batch, 11, 8, generator=g).to(dtype)
    idx = torch.randint(-1, 11, (batch, 5, 7), generator=g)                # −1: empty entries read row 0
    got = selected_rows(kv, idx)
    assert got.shape == (batch, 5, 7, 8) and torch.equal(got, gather_rows(kv, idx))


def test_fast_attention_reads_its_rows_by_index_select():
    assert Attention.gather_rows is not FastAttention.gather_rows
    kv, idx = torch.randn(2, 4, 3), torch.tensor([[[3, -1]], [[0, 2]]])
    assert torch.equal(FastAttention.gather_rows(None, kv, idx), Attention.gather_rows(None, kv, idx))
