"""Corrupt, foreign and hostile trace files (issue 16): each is a real tiny-model trace, damaged, and every one gets
a TraceFormatError naming the file and the problem, by path and as uploaded bytes; the memory bombs are refused
within seconds and a few hundred MB in a child process under a 1 GiB address-space cap."""
from __future__ import annotations

import io
import json
import re
import struct
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.generation import DSparkConfig
from engine.generation.speculative import generate_speculative
from engine.request import GenerationRequest
from engine.trace import Trace, TraceBudget, TraceFormatError, load_trace, load_trace_bytes, save_trace
from engine.trace.limits import MAX_FILE_BYTES, MAX_ROWS
from tests.bounded import run_python
from tests.model_helpers import tiny_model

NAMES = {"json": "t.json", "parquet": "t.parquet.zip", "safetensors": "t.safetensors"}


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> tuple[Trace, dict[str, bytes]]:
    """A trace of two rows of the tiny model decoding with DSpark and recording attention, as bytes per format."""
    model = tiny_model(dtype=torch.float32, vocab_size=512, dspark_noise_token_id=511)
    trace = Trace(TraceBudget(attention=True, top_k_logits=3, lens=True),
                  meta={"config": "tiny-v4.1", "prompt": "Hi, ça va?"})
    generate_speculative(model, [[0, 5, 6, 7], [0, 9]], GenerationRequest.of(4, trace=trace, dspark=DSparkConfig()),
                         token_text=lambda i: f"t{i}")
    folder = tmp_path_factory.mktemp("real")
    files = {fmt: save_trace(trace, folder / name).read_bytes() for fmt, name in NAMES.items()}
    assert trace.dspark_steps and trace.paths("attention") and trace.paths("lens")  # every table has rows to damage
    return trace, files


def refused(tmp_path: Path, name: str, data: bytes, pattern: str) -> str:
    """Assert that both loaders refuse the file with TraceFormatError naming it and matching `pattern`."""
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(TraceFormatError) as by_path:
        load_trace(path)
    with pytest.raises(TraceFormatError) as by_bytes:
        load_trace_bytes(name, data)
    for err, shown in ((by_path, str(path)), (by_bytes, name)):
        message = str(err.value)
        assert message.startswith(f"{shown}: "), message
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    return str(by_bytes.value)


def test_the_undamaged_files_load(real):
    trace, files = real
    for fmt, data in files.items():
        assert load_trace_bytes(NAMES[fmt], data) == trace


# ---- JSON -------------------------------------------------------------------------------------

def _put(table: str, column: str, index: int, value):
    return lambda b: b["tables"][table][column].__setitem__(index, value)


def _first_generated(body: dict) -> int:
    return body["tables"]["tokens"]["generated"].index(True)


JSON_CASES = {
    "header is a list": (lambda b: b.update(header=[1, 2]), "the trace header is a list"),
    "tables is a list": (lambda b: b.update(tables=[]), "the trace tables are a list"),
    "wrong version": (lambda b: b["header"].update(version=2), "version 2 is not supported"),
    "budget of the wrong type": (lambda b: b["header"]["budget"].update(max_tokens="many"), "budget 'max_tokens'"),
    "meta is a string": (lambda b: b["header"].update(meta="x"), "header 'meta' is a string, expected an object"),
    "meta nested 900 levels": (lambda b: b["header"]["meta"].update(deep=json.loads("[" * 900 + "]" * 900)),
                               "'meta' nests lists and objects deeper than 4 levels"),
    "negative omitted count": (lambda b: b["header"].update(omitted={"moe": -1}), "'omitted' must map"),
    "a field declared [100000, 100000]": (lambda b: b["header"]["schema"]["mhc"]["comb"].update(shape=[10**5, 10**5]),
                                          r"mhc\.comb declares shape \[100000, 100000\].*limit is 1,024"),
    "10^9 rows declared": (lambda b: b["header"]["n_rows"].update(moe=10**9), r"declares 1,000,00\d,\d+ table rows"),
    "missing table": (lambda b: b["tables"].pop("dspark"), "table 'dspark' is missing"),
    "column shorter than declared": (lambda b: b["tables"]["moe"]["expert"].pop(),
                                     r"column 'expert' has \d+ rows; the header declares \d+"),
    "missing column": (lambda b: b["tables"]["moe"].pop("score"), "table 'moe' lacks column score"),
    "unexpected column": (lambda b: b["tables"]["moe"].update(extra=[]), "table 'moe' has unexpected column extra"),
    "NaN in an mHC matrix": (_put("mhc", "comb_0_0", 0, float("nan")), r"field 'comb' holds 1 non-finite"),
    "Infinity in a router weight": (_put("moe", "weight", 3, float("inf")), r"field 'weight' holds 1 non-finite"),
    "float32 overflow in a gate": (_put("engram", "gates_0", 0, 1e300), r"field 'gates' holds 1 non-finite"),
    "text in an integer column": (_put("moe", "row", 0, "0"), "column 'row' holds a string where integers belong"),
    "fraction in an integer column": (_put("moe", "pos", 0, 1.5), "'pos' holds a number where integers belong"),
    "nested list in a column": (_put("attention", "topk_0", 0, [1, 2]), "a list where integers belong"),
    "integer beyond int64": (_put("tokens", "token_id", 0, 2**70), "beyond the 64-bit range"),
    "negative position": (_put("mhc", "pos", 0, -3), "column 'pos' holds a negative value"),
    "ragged length beyond its width": (_put("attention", "topk_len", 0, 99), "beyond the declared width"),
    "unknown mHC site": (_put("mhc", "site", 0, "mlp"), "sites are attn, ffn"),
    "token recorded twice": (lambda b: b["tables"]["tokens"]["pos"].__setitem__(1, 0), r"\(row, pos\) \(0, 0\) twice"),
    "top-k lengths differ": (lambda b: b["tables"]["tokens"]["top_probs_len"].__setitem__(_first_generated(b), 1),
                             "top_ids, top_logits and top_probs differ in length"),
    "accepted beyond verify_len": (_put("dspark", "accepted", 0, 99),
                                   r"table 'dspark' row 0: DSparkStep needs 0 <= accepted \(99\)"),
    "empty module path": (_put("engram", "path", 0, ""), "empty module path"),
    "lens table missing though declared": (lambda b: b["tables"].pop("lens"), "table 'lens' is missing"),
    "lens declared by the schema alone": (lambda b: b["header"]["n_rows"].pop("lens"), r"'n_rows' lacks lens"),
    "infinite lens probability": (_put("lens", "next_prob", 0, float("inf")), r"field 'next_prob' holds 1 non-finite"),
    "lens budget not a bool": (lambda b: b["header"]["budget"].update(lens="yes"), "budget 'lens' must be true/false"),
    # token ids outside any vocabulary (issue 46: these loaded and every panel drew them)
    "token id 10^12": (_put("tokens", "token_id", 0, 10**12),
                       r"column 'token_id' holds token id 1,000,000,000,000, outside the vocabulary \(ids below "
                       r"4,194,304, the largest vocabulary a config may declare\)"),
    "top-k id 10^12": (_put("tokens", "top_ids_0", 5, 10**12), "column 'top_ids_0' holds token id 1,000,000,000,000"),
    "drafted id 10^12": (_put("dspark", "drafted_0", 0, 10**12), "column 'drafted_0' holds token id 1,000,000,000,000"),
    "lens top id 10^12": (_put("lens", "top_ids_0", 0, 10**12), "table 'lens' column 'top_ids_0' holds token id"),
    "token id beyond the declared vocabulary": (
        lambda b: (b["header"]["meta"].update(vocab_size=512), _put("tokens", "token_id", 2, 512)(b)),
        r"holds token id 512, outside the vocabulary \(ids below the vocabulary of 512 ids the header's meta"),
}


@pytest.mark.parametrize("case", list(JSON_CASES))
def test_damaged_json_traces(tmp_path, real, case):
    mutate, pattern = JSON_CASES[case]
    body = json.loads(real[1]["json"])
    mutate(body)
    refused(tmp_path, "t.json", json.dumps(body).encode(), pattern)


def test_malformed_json_text(tmp_path, real):
    text = real[1]["json"]
    refused(tmp_path, "t.json", text[: len(text) // 2], "invalid JSON at line 1")
    refused(tmp_path, "t.json", b'{"header": "\xff"}', r"not UTF-8 text \(byte 12\)")
    refused(tmp_path, "t.json", b'{"header": ' + b"[" * 5000 + b"]" * 5000 + b', "tables": {}}', "nests too deeply")
    refused(tmp_path, "t.json", b"[" * 200_000 + b"]" * 200_000, "200,000 opening brackets")
    refused(tmp_path, "t.json", b'{"tables": {}, ' + text[1:], "names key 'tables' twice")
    refused(tmp_path, "t.json", b'{"hello": 1}', "lacks the 'header' and 'tables'")
    refused(tmp_path, "t.json", b"", "the file is empty")


def test_an_unknown_suffix_is_one_trace_format_error_on_every_path(tmp_path, real):
    """load_trace, Trace.load, Trace.from_bytes and the app's upload reader all raise TraceFormatError (an
    InputError) for a name that is no trace format, naming it and the accepted suffixes."""
    from v41viz.inspect.export import trace_from_upload
    path = tmp_path / "t.pickle"
    path.write_bytes(real[1]["json"])
    for read in (load_trace, Trace.load, lambda p: Trace.from_bytes(p.name, p.read_bytes()),
                 lambda p: trace_from_upload(p.name, p.read_bytes())):
        with pytest.raises(TraceFormatError, match=r"t\.pickle: unknown trace format; use a name ending in \.json"):
            read(path)


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(64 * 2**30)  # sparse: 64 GiB by its size, nothing on disk
    with pytest.raises(TraceFormatError, match=r"huge.json: the file has 65,536.0 MiB; a json trace may have at most"):
        load_trace(path)
    with pytest.raises(TraceFormatError, match=r"u.safetensors: the file has 24.0 MiB"):
        load_trace_bytes("u.safetensors", bytes(MAX_FILE_BYTES["safetensors"] + 1))


# ---- Parquet zip ------------------------------------------------------------------------------

def _members(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return {n: z.read(n) for n in z.namelist()}


def _zip(members: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=method) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return out.getvalue()


def raw_zip(members: list[tuple[str, bytes, int]], *, method: int = 0, flags: int = 0) -> bytes:
    """A zip written by hand: (name, payload, declared uncompressed size) per member, CRC 0 (a reader checks it
    only after inflating the whole member, so a wrong one does not defuse a bomb)."""
    local, central = bytearray(), bytearray()
    for name, payload, size in members:
        n = name.encode()
        offset = len(local)
        local += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, flags, method, 0, 0, 0, len(payload), size, len(n), 0)
        local += n + payload
        central += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, flags, method, 0, 0, 0, len(payload), size,
                               len(n), 0, 0, 0, 0, 0, offset) + n
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(central), len(local), 0)
    return bytes(local + central + end)


def _table(data: bytes):
    import pyarrow.parquet as pq
    return pq.read_table(io.BytesIO(data))


def _parquet(table, **kw) -> bytes:
    import pyarrow.parquet as pq
    out = io.BytesIO()
    pq.write_table(table, out, **kw)
    return out.getvalue()


def _replace_column(data: bytes, name: str, array) -> bytes:
    table = _table(data)
    return _parquet(table.set_column(table.column_names.index(name), name, array))


def _with(**new):
    return lambda m: _zip({**m, **new})


def _with_moe(change):
    return lambda m: _zip({**m, "moe.parquet": change(m["moe.parquet"])})


def _bad_crc(m: dict[str, bytes]) -> bytes:
    data = bytearray(_zip(m))
    data[data.find(m["moe.parquet"][100:140])] ^= 0xFF
    return bytes(data)


def _column_of(name: str, make):
    return _with_moe(lambda moe: _replace_column(moe, name, make(_table(moe).num_rows)))


def _pa():
    import pyarrow as pa
    return pa


PARQUET_CASES = {
    "not a zip": (lambda m: b"PK\x03\x04 and then garbage", "not a zip file"),
    "missing member": (lambda m: _zip({k: v for k, v in m.items() if k != "dspark.parquet"}), "lacks dspark.parquet"),
    "unexpected member": (_with(**{"evil.py": b"print(1)"}), "unexpected member evil.py"),
    "header not JSON": (_with(**{"trace.json": b"{nope"}), "trace.json is not valid JSON"),
    "damaged table": (_with_moe(lambda moe: moe[: len(moe) // 2]), "moe.parquet is not a readable Parquet table"),
    "bad CRC": (_bad_crc, r"zip member 'moe.parquet' is damaged \(Bad CRC-32"),
    "LZMA member": (lambda m: _zip(m, zipfile.ZIP_LZMA), "uses compression method 14"),
    "encrypted member": (lambda m: raw_zip([("trace.json", b"{}", 2)], flags=1), "'trace.json' is encrypted"),
    "65,000 members": (lambda m: raw_zip([(f"m{i}", b"", 0) for i in range(65_000)]), "the zip has 65,000 members"),
    "2 GiB declared": (lambda m: raw_zip([(k, b"", 2**31 if k == "moe.parquet" else 0) for k in m]),
                       r"'moe.parquet' expands 2,147,483,648 times"),
    "nested column": (_column_of("expert", lambda n: _pa().array([[1]] * n)), "column 'expert' has type list<"),
    "missing values": (_column_of("weight", lambda n: _pa().array([None] * n, _pa().float32())),
                       r"column 'weight' has \d+ missing values"),
    "float column where integers belong": (_column_of("expert", lambda n: _pa().array(np.full(n, 0.5))),
                                           "column 'expert' holds float64 values where integers belong"),
    "gzip codec": (_with_moe(lambda moe: _parquet(_table(moe), compression="gzip")), "compressed with GZIP"),
    "rows differ from the header": (_with_moe(lambda moe: _parquet(_table(moe).slice(1))),
                                    r"column 'path' has (\d+) rows; the header declares (?!\1)\d+"),
}


@pytest.mark.parametrize("case", list(PARQUET_CASES))
def test_damaged_parquet_traces(tmp_path, real, case):
    build, pattern = PARQUET_CASES[case]
    refused(tmp_path, "t.parquet.zip", build(_members(real[1]["parquet"])), pattern)


# ---- safetensors ------------------------------------------------------------------------------

def _split(data: bytes) -> tuple[dict, bytes]:
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join(header: dict, buffer: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + buffer


def _edited(change):
    """A case builder: the file with its safetensors header changed in place by change(header)."""
    def build(data: bytes) -> bytes:
        header, buffer = _split(data)
        change(header)
        return _join(header, buffer)
    return build


def _trace_header(change):
    """A case builder: the file with the trace header in its metadata changed by change(trace_header)."""
    def edit(header: dict) -> None:
        meta = json.loads(header["__metadata__"]["v41viz-trace"])
        change(meta)
        header["__metadata__"]["v41viz-trace"] = json.dumps(meta)
    return _edited(edit)


def _poked(key: str, value):
    """A case builder: the file with tensor `key`'s first element overwritten by value."""
    def build(data: bytes) -> bytes:
        header, buffer = _split(data)
        start = header[key]["data_offsets"][0]
        dtype = np.dtype({"F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "BOOL": "u1"}[header[key]["dtype"]])
        out = bytearray(buffer)
        out[start:start + dtype.itemsize] = np.array([value], dtype).tobytes()
        return _join(header, bytes(out))
    return build


def _reshape(key: str, shape):
    return _edited(lambda h: h[key].update(shape=shape(h[key]["shape"][0])))


def _overlap(h: dict) -> None:
    size = max(e["data_offsets"][1] for k, e in h.items() if k != "__metadata__")
    span = {"dtype": "I64", "shape": [size // 8], "data_offsets": [0, size // 8 * 8]}
    h.update({f"moe/x{i}": dict(span) for i in range(3)})


SAFETENSORS_CASES = {
    "header length 2^40": (lambda d: struct.pack("<Q", 2**40) + d[8:], "header declares 1,099,511,627,776 bytes"),
    "header past the end": (lambda d: struct.pack("<Q", len(d)) + d[8:], "runs past the end"),
    "header not JSON": (lambda d: struct.pack("<Q", 5) + b"{nope" + _split(d)[1], "header is not valid JSON"),
    "no trace header": (_edited(lambda h: h.pop("__metadata__")), "no v41viz trace header"),
    "trace header not JSON": (_edited(lambda h: h["__metadata__"].update({"v41viz-trace": "{nope"})),
                              "trace header in the safetensors metadata is not valid JSON"),
    "BF16 tensor": (_edited(lambda h: h["moe/weight"].update(dtype="BF16")), "'moe/weight' has dtype 'BF16'"),
    "2-D tensor": (_reshape("moe/weight", lambda n: [1, n]), "a trace column is 1-D"),
    "shape disagrees with offsets": (_reshape("moe/weight", lambda n: [n + 1]), "data_offsets span"),
    "offsets outside the file": (_edited(lambda h: h["moe/weight"].update(data_offsets=[10**9, 10**9 + 8])),
                                 "outside the file's"),
    "overlapping tensors": (_edited(_overlap), "more than the file's"),
    "unknown tensor": (_edited(lambda h: h.update(weights=h.pop("moe/weight"))), "unexpected tensor 'weights'"),
    "string codes out of range": (_poked("moe/path", 99), "string codes of 'moe/path' point outside its category"),
    "categories of the wrong type": (_trace_header(lambda m: m["categories"].update({"moe/path": [1, 2]})),
                                     "'categories' must map tensor names to lists of strings"),
    "bool bytes other than 0/1": (_poked("moe/vision", 7), "other than 0 and 1"),
    "Inf in a gate": (_poked("engram/gates_0", np.inf), "'gates' holds 1 non-finite"),
    "NaN in a confidence": (_poked("dspark/confidences_0", np.nan), "'confidences' holds 1 non-finite"),
    "n_rows of the wrong type": (_trace_header(lambda m: m["n_rows"].update(moe="many")),
                                 "'n_rows' of table 'moe' must be a non-negative integer"),
}


@pytest.mark.parametrize("case", list(SAFETENSORS_CASES))
def test_damaged_safetensors_traces(tmp_path, real, case):
    build, pattern = SAFETENSORS_CASES[case]
    refused(tmp_path, "t.safetensors", build(real[1]["safetensors"]), pattern)


# ---- random damage ----------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", list(NAMES))
def test_random_damage_loads_or_is_refused_never_anything_else(real, fmt):
    """100 seeded damages per format (overwritten bytes, truncations, repeated spans): each either still reads
    as a valid trace or raises TraceFormatError naming the file — no other exception type."""
    rng = np.random.default_rng(16)
    original, refusals = real[1][fmt], 0
    for _ in range(100):
        data = bytearray(original)
        kind = rng.integers(3)
        if kind == 0:
            for at in rng.integers(len(data), size=4):
                data[at] = int(rng.integers(256))
        elif kind == 1:
            del data[rng.integers(len(data)):]
        else:
            at, span = rng.integers(len(data), size=2)
            data[at:at] = data[span: span + 64]
        try:
            load_trace_bytes(NAMES[fmt], bytes(data))
        except TraceFormatError as e:
            assert str(e).startswith(f"{NAMES[fmt]}: ")
            refusals += 1
    assert refusals >= 50  # the damage is real: most of it is refused


# ---- the engine API ---------------------------------------------------------------------------

def test_from_tables_refuses_what_a_caller_hands_it(real):
    tables, header = real[0].to_tables()
    with pytest.raises(TraceFormatError, match="the trace header is null"):
        Trace.from_tables(tables, None)
    with pytest.raises(TraceFormatError, match="the trace tables are null"):
        Trace.from_tables(None, header)
    moe = dict(tables["moe"], expert=tables["moe"]["expert"].reshape(-1, 1))
    with pytest.raises(TraceFormatError, match=r"column 'expert' has shape \(\d+, 1\); a column is 1-D"):
        Trace.from_tables(dict(tables, moe=moe), header)
    moe = dict(tables["moe"], expert=np.where(np.arange(len(tables["moe"]["expert"])) == 0, np.nan, 1.0))
    with pytest.raises(TraceFormatError, match="column 'expert' holds float64 values where integers belong"):
        Trace.from_tables(dict(tables, moe=moe), header)
    assert Trace.from_tables(tables, header) == real[0]


# ---- memory bombs, in a child process under a 1 GiB cap ----------------------------------------

def _json_shape_bomb(tmp_path: Path, real) -> Path:
    """The issue's case: a small JSON trace whose schema declares a [100000, 100000] field."""
    body = json.loads(real[1]["json"])
    body["header"]["schema"]["mhc"]["comb"]["shape"] = [100_000, 100_000]
    path = tmp_path / "shape.json"
    path.write_text(json.dumps(body))
    return path


def _zip_bomb(tmp_path: Path, real) -> Path:
    """The issue's case: a ~1.2 MB .parquet.zip whose trace.json inflates to 1.1 GiB."""
    chunk = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = chunk.compress(bytes(2**24)) + chunk.flush(zlib.Z_FULL_FLUSH)  # 16 MiB of zeros, byte-aligned
    stream = block * 70 + zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # [70 x 16 MiB] then the final block
    members = [("trace.json", stream, 70 * 2**24)] + \
              [(n, d, len(d)) for n, d in _members(real[1]["parquet"]).items() if n != "trace.json"]
    path = tmp_path / "bomb.parquet.zip"
    path.write_bytes(raw_zip(members, method=zipfile.ZIP_DEFLATED))
    return path


def _json_list_bomb(tmp_path: Path, real) -> Path:
    """15 M empty lists in 45 MiB (under the file limit): 1 GB of Python lists if parsed."""
    path = tmp_path / "lists.json"
    path.write_bytes(b"[" + b"[]," * 15_000_000 + b"[]]")
    return path


def _parquet_rows_bomb(tmp_path: Path, real) -> Path:
    """A 46 KB moe.parquet whose footer lists 200 row groups over the same pages: 839 M rows, 6.7 GB decoded."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    one = _parquet(pa.table({"row": pa.array(np.zeros(2**22, np.int64))}), use_dictionary=False,
                   column_encoding={"row": "DELTA_BINARY_PACKED"}, row_group_size=2**22)
    footer_len = int.from_bytes(one[-8:-4], "little")
    meta = pq.ParquetFile(io.BytesIO(one)).metadata
    for _ in range(199):
        meta.append_row_groups(pq.ParquetFile(io.BytesIO(one)).metadata)
    sink = io.BytesIO()
    meta.write_metadata_file(sink)
    bomb = one[: -(8 + footer_len)] + sink.getvalue()[4:]  # the data pages, then the new footer (after its 'PAR1')
    path = tmp_path / "rows.parquet.zip"
    path.write_bytes(_zip({**_members(real[1]["parquet"]), "moe.parquet": bomb}))
    return path


def _safetensors_overlap_bomb(tmp_path: Path, real) -> Path:
    """6000 tensors that all span the same 2 MiB: 12 GB of copies if each were read."""
    header, _ = _split(real[1]["safetensors"])
    buffer = bytes(MAX_ROWS * 8)
    header = {k: v for k, v in header.items() if k == "__metadata__"}
    header.update({f"moe/x{i}": {"dtype": "I64", "shape": [len(buffer) // 8], "data_offsets": [0, len(buffer)]}
                   for i in range(6000)})
    path = tmp_path / "overlap.safetensors"
    path.write_bytes(_join(header, buffer))
    return path


BOMBS = {
    "json declaring a [100000, 100000] field": (_json_shape_bomb, r"declares shape \[100000, 100000\]"),
    "zip member inflating to 1.1 GiB": (_zip_bomb, r"'trace.json' expands [\d,]+ times"),
    "json of 15 M empty lists": (_json_list_bomb, "15,000,002 opening brackets"),
    "parquet declaring 839 M rows": (_parquet_rows_bomb, r"declare 838,8[\d,]+ rows; a trace holds at most 262,144"),
    "safetensors with overlapping tensors": (_safetensors_overlap_bomb, "the tensors declare 1,572,864,000 cells"),
}


# The child reports its own peak (VmHWM of its address space): Linux carries the forking parent's resident size
# (this pytest process, torch loaded) into the child's ru_maxrss across exec, so Outcome.peak_rss_mib over-counts.
CHILD = """import time
from engine.trace import TraceFormatError, load_trace
start = time.perf_counter()
try:
    load_trace({path!r})
except TraceFormatError as e:
    print(f"refused after {{time.perf_counter() - start:.2f}} s:", e)
peak = next(line for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print("peak_kib", peak.split()[1])
"""


@pytest.mark.parametrize("case", list(BOMBS))
def test_memory_bombs_are_refused_fast_and_small(tmp_path, real, case):
    build, pattern = BOMBS[case]
    path = build(tmp_path, real)
    out = run_python(CHILD.format(path=str(path)), timeout_s=60, memory_cap_mib=1024)
    assert out.returncode == 0 and out.stdout.startswith("refused after"), (out.stdout, out.stderr[-2000:])
    assert str(path) in out.stdout and re.search(pattern, out.stdout), out.stdout
    seconds = float(out.stdout.split()[2])
    peak_mib = int(out.stdout.split()[-1]) / 1024
    assert seconds < 3 and out.wall_s < 20, (seconds, out.wall_s)
    assert peak_mib < 200, peak_mib
    print(f"{case}: refused after {seconds:.2f} s, child wall {out.wall_s:.1f} s, peak RSS {peak_mib:.0f} MiB")


# ---- the limits admit the largest trace the app and CLI write -----------------------------------

def design_point_trace() -> Trace:
    """What default-small (the shipped checkpoint's config, the largest runnable preset) records with attention and
    the logit lens at TraceBudget's default of 2048 token slots (2 rows x 1024 positions), with random values in the
    model's shapes (the lens read out by a random head over the model's vocabulary)."""
    from engine.spec.presets import resolve_config
    a = resolve_config("default-small")
    rows, n = 2, a.max_seq_len
    g = torch.Generator().manual_seed(0)
    trace = Trace(TraceBudget(max_tokens=2048, attention=True, lens=True),
                  meta={"config": "default-small", "prompt": "x" * 4000})
    positions = torch.arange(n).expand(rows, n)
    head = torch.randn(a.vocab_size, 8, generator=g)   # (reads 8 of the dims: the table's sizes are the point)
    for layer in range(a.n_layers):
        path = f"layers.{layer}"
        scores = torch.rand(rows, n, a.n_activated_experts, generator=g)
        trace.record_moe(path, None, positions, torch.randint(0, a.n_routed_experts, scores.shape, generator=g),
                         scores, scores)
        for site in ("attn", "ffn"):
            trace.record_mhc(path, site, None, positions, *(torch.rand(rows, n, a.hc_mult, generator=g) for _ in "pp"),
                             torch.rand(rows, n, a.hc_mult, a.hc_mult, generator=g), *torch.rand(2, rows, n))
        if layer in a.engram_layer_ids:
            trace.record_engram(path, None, positions, torch.randint(0, 99, (rows, n), generator=g),
                                torch.randint(0, 10**6, (rows, n, a.engram_n_heads * (a.engram_max_ngram_size - 1))),
                                torch.rand(rows, n, a.hc_mult, generator=g))
        trace.record_attention(f"{path}.attn", None, positions, torch.randint(-1, n, (rows, n, a.index_topk)),
                               *torch.rand(3, rows, n))
        trace.record_lens(path, None, positions, torch.randn(rows, n, a.dim, generator=g),
                          *torch.rand(2, rows, n, a.hc_mult, generator=g), lambda x: x[:, :8] @ head.T)
    for row in range(rows):
        trace.record_prompt(row, range(n - 24), [f"tok{i}" for i in range(n - 24)])
        for step, pos in enumerate(range(n - 24, n)):
            trace.record_token(row, pos, 7, "tok", step=step, step_time_s=0.01, logits=torch.randn(a.vocab_size))
    return trace


# a 2048-token default-small trace in three formats, the lens's 16 k read-outs resolved [24-70 s]
@pytest.mark.slow
def test_limits_admit_the_design_point(tmp_path):
    from engine.trace import limits
    trace = design_point_trace()
    tables, header = trace.to_tables()
    rows = sum(header["n_rows"].values())
    cells = sum(len(t) * header["n_rows"][name] for name, t in tables.items())
    assert 2 * rows <= limits.MAX_ROWS and 2 * cells <= limits.MAX_CELLS, (rows, cells)
    assert max(len(t) for t in tables.values()) * 20 < limits.MAX_COLUMNS
    for fmt, name in NAMES.items():
        path = save_trace(trace, tmp_path / name)
        size = path.stat().st_size
        assert 1.5 * size < limits.MAX_FILE_BYTES[fmt], (fmt, size)
        assert load_trace(path).summary() == trace.summary()  # exactness: test_trace.py's round trips
