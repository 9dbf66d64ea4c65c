"""HostEngramTable: FP8 Engram rows stay on the host; only the rows the tokens hash to are read and dequantized."""
from __future__ import annotations

import copy

import pytest
import torch

from engine.checkpoint.official import ShardRows
from engine.model import EngineOptions, Transformer, init_weights
from engine.model.engram import Engram
from engine.quant import HostEngramTable, TensorRows, quantize_model
from engine.quant.formats import dequantize_engram_rows, quantize_engram_rows
from engine.spec.errors import InputError
from engine.speedups.kernel_modules import KernelEngram
from tests.model_helpers import random_tokens, synthetic_token_map, tiny_args


class CountingRows:
    """The RowSource interface over a tensor, recording every call's ids (what a memory-mapped source reads)."""

    def __init__(self, table: torch.Tensor):
        self.table, self.calls = table, []

    @property
    def shape(self):
        return tuple(self.table.shape)

    @property
    def dtype(self):
        return self.table.dtype

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        self.calls.append(ids.clone())
        return self.table[ids]

    @property
    def rows_read(self) -> int:
        return sum(c.numel() for c in self.calls)


def quantized_table(n_rows: int = 500, head_dim: int = 64, seed: int = 0):
    w = torch.randn(n_rows, head_dim, generator=torch.Generator().manual_seed(seed))
    return quantize_engram_rows(w)


def counting_table(n_rows: int = 500, head_dim: int = 64, dtype=torch.float32):
    codes, scales = quantized_table(n_rows, head_dim)
    table = HostEngramTable(n_rows, head_dim, dtype=dtype)
    table.attach(CountingRows(codes), CountingRows(scales))
    return table, codes, scales


def test_rows_are_the_gathered_dequantized_rows_and_only_those_are_read():
    table, codes, scales = counting_table()
    ids = torch.tensor([[3, 17, 3, 499], [0, 17, 17, 42]])                 # [2, 4], repeats
    rows = table(ids)
    assert rows.shape == (2, 4, 64) and rows.dtype == torch.float32
    assert torch.equal(rows, dequantize_engram_rows(codes[ids], scales[ids]))
    for source in (table.weight_source, table.scale_source):
        assert len(source.calls) == 1
        assert source.calls[0].tolist() == [0, 3, 17, 42, 499]                # each distinct row once, ascending


def test_rows_follow_the_models_dtype_and_never_the_table():
    table, codes, _ = counting_table(dtype=torch.bfloat16)
    table.to(torch.float64)
    ids = torch.tensor([5, 6])
    assert table(ids).dtype == torch.float64
    assert table.weight_source.table is codes and codes.dtype == torch.float8_e4m3fn   # the table stays as it was
    assert list(table.parameters()) == [] and all(b.numel() == 0 for b in table.buffers())


def test_an_unattached_table_says_what_to_do():
    with pytest.raises(InputError, match="attach"):
        HostEngramTable(10, 32)(torch.tensor([1]))


def test_attach_checks_the_official_shapes_and_dtypes():
    codes, scales = quantized_table(10, 32)
    table = HostEngramTable(10, 32)
    with pytest.raises(InputError, match="scale"):
        table.attach(TensorRows(codes), TensorRows(scales.float()))
    with pytest.raises(InputError, match="weight"):
        table.attach(TensorRows(codes[:9]), TensorRows(scales))


def test_state_dict_lists_meta_stand_ins_and_whole_tensors_load_into_memory():
    codes, scales = quantized_table(20, 64)
    table = HostEngramTable(20, 64)
    state = table.state_dict()
    assert {k: (tuple(v.shape), v.dtype, v.is_meta) for k, v in state.items()} == {
        "weight": ((20, 64), torch.float8_e4m3fn, True), "scale": ((20, 2), torch.float8_e8m0fnu, True)}
    with pytest.raises(InputError, match="no data"):
        table.load_state_dict(state)
    table.load_state_dict({"weight": codes, "scale": scales})
    assert torch.equal(table(torch.tensor([7])), dequantize_engram_rows(codes[7:8], scales[7:8]))


def test_the_official_row_source_reads_a_memory_mapped_shard(tmp_path):
    from safetensors.torch import save_file
    codes, scales = quantized_table(300, 64, seed=2)
    shard = tmp_path / "model-00001-of-00001.safetensors"
    save_file({"layers.1.engram.embed.weight": codes, "layers.1.engram.embed.scale": scales}, str(shard))
    table = HostEngramTable(300, 64)
    table.attach(ShardRows(shard, "layers.1.engram.embed.weight", codes.shape, codes.dtype),
                 ShardRows(shard, "layers.1.engram.embed.scale", scales.shape, scales.dtype))
    ids = torch.tensor([[299, 0, 150], [150, 1, 2]])
    assert torch.equal(table(ids), dequantize_engram_rows(codes[ids], scales[ids]))


@pytest.fixture(scope="module")
def host_model():
    """The tiny fp8 model quantized from random weights, each Engram table re-attached to counting sources."""
    a = tiny_args(dtype="fp8", expert_dtype="fp4")
    model = Transformer(a, synthetic_token_map(a), dtype=torch.float32, options=EngineOptions(act_quant=True))
    init_weights(model, 0)
    model = quantize_model(model.eval())
    for m in model.modules():
        if isinstance(m, HostEngramTable):
            m.attach(CountingRows(m.weight_source.table), CountingRows(m.scale_source.table))
    return model


def host_tables(model) -> list[HostEngramTable]:
    return [m for m in model.modules() if isinstance(m, HostEngramTable)]


def test_a_forward_reads_only_the_rows_its_tokens_hash_to(host_model):
    tokens = random_tokens(2, 9, seed=4)
    with torch.no_grad():
        host_model(tokens)
    a = host_model.args
    for table, n_rows in zip(host_tables(host_model), a.engram_num_embeddings):
        read = table.weight_source.rows_read
        # at most one row per (token, column); the table has thousands
        assert 0 < read <= tokens.numel() * a.engram_n_columns < n_rows
        assert table.scale_source.rows_read == read
        table.weight_source.calls.clear()
        table.scale_source.calls.clear()


def test_the_kernel_engram_falls_back_to_the_host_gather(host_model):
    """The Triton swap would index a device table; with a host table it must take the reference path."""
    model = copy.deepcopy(host_model)
    tokens = random_tokens(1, 6, seed=9)
    with torch.no_grad():
        want = model(tokens).logits
        for m in model.modules():
            if type(m) is Engram:
                m.__class__ = KernelEngram
        assert torch.equal(model(tokens).logits, want)
