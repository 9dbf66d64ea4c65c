"""How large a trace file may be: every limit the loaders check before they allocate, with its derivation."""
from __future__ import annotations

# Derivation. The largest trace the app or the CLI writes comes from the largest runnable preset, default-small (the
# shipped checkpoint's config: 8 layers, top-2 of 16 experts, 4 mHC streams, 2 Engram layers, index top-32,
# max_seq_len 1024), recording attention, with DSpark on. The CLI runs one row (at most 1024 token slots) and the
# app keeps 1024 (TRACE_MAX_TOKENS); the design point is TraceBudget's default of 2048 slots (2 rows x 1023
# positions through the engine API). Measured on a real run of the shipped checkpoint:
#   JSON 25.5 MiB, Parquet zip 5.9 MiB (7 stored members, 6.6 MB of column chunks uncompressed), safetensors
#   10.9 MiB (header 36 KB); 88,555 table rows and 2.03 M cells in all (moe and mhc 33,012 rows each, attention
#   39 columns); the JSON has 2.03 M values, 122 k strings and 243 brackets; loading took 0.4-1.4 s and
#   100-220 MB of peak RSS (67 MB of it the imports).
# The logit lens (recorded by the app since issue 20) adds a table of 16,384 rows x 24 columns at the design point:
# 104,448 rows and 2.40 M cells in all; JSON 30.0 MiB, Parquet zip 8.2 MiB (8 members), safetensors 12.9 MiB; loading
# took 0.8-1.6 s (tests/trace/test_bad_traces.py::design_point_trace, random values). MAX_CELLS rose from 4 Mi to
# 5 Mi cells for it (the JSON value count with it: about 5 s and 450 MB to load the worst JSON the counts admit,
# scaled from the 4 s and 370 MB below; a bare json.loads of 6.3 M values measured 2.7 s and 300 MB).
# Each limit is about twice that, four times what the app and CLI reach (tests/trace/test_bad_traces.py::
# test_limits_admit_the_design_point rebuilds the design point and checks it loads with a margin). A file at the
# limits still loads in a few seconds and a few hundred MB (worst measured: 3.4 s and 290 MB for a 15 MiB Parquet
# zip of 98 k mHC rows; 4 s and 370 MB to parse the worst JSON the counts admit); a hostile one is refused before
# its bulk is read.

MiB = 2**20

# Whole files, by format (trace_format's names); checked on the file size or the uploaded bytes before reading.
MAX_FILE_BYTES = {"json": 48 * MiB, "parquet": 16 * MiB, "safetensors": 24 * MiB}

# The trace header (trace.json inside the zip; the safetensors header with its metadata).
MAX_HEADER_BYTES = 4 * MiB

# Parquet zip: members (8 written), the sum of the members' declared uncompressed sizes, read from the central
# directory before extracting; the compression ratio of any member over RATIO_FLOOR_BYTES (the writer stores
# members uncompressed, ratio 1; deflate on tables gives < 10, a deflate bomb ~1000); only stored or deflated members.
MAX_ZIP_MEMBERS = 16
MAX_ZIP_BYTES = 32 * MiB
MAX_ZIP_RATIO = 100
RATIO_FLOOR_BYTES = 64 * 1024

# Tables, from the declared shapes (header n_rows and schema, Parquet metadata, safetensors header) before any
# column is built: rows over all tables, columns per table (and values per field of one row), cells (rows x
# columns) over all tables, and declared decoded bytes (Parquet column chunks uncompressed; safetensors tensors).
MAX_ROWS = 262_144
MAX_COLUMNS = 1_024
MAX_CELLS = 5 * MiB
MAX_DECODED_BYTES = 32 * MiB

# JSON, counted on the raw bytes before parsing (commas, quotes and brackets bound what the parser builds):
# values, strings and containers (lists and objects). Characters inside strings only over-count.
MAX_JSON_VALUES = MAX_CELLS + MiB
MAX_JSON_STRINGS = MiB
MAX_JSON_CONTAINERS = 64 * 1024


def describe() -> str:
    """The limits as one sentence (for error messages and the README)."""
    sizes = ", ".join(f"{fmt} {n // MiB} MiB" for fmt, n in MAX_FILE_BYTES.items())
    return (f"trace files up to {sizes}; a Parquet zip of at most {MAX_ZIP_MEMBERS} members, "
            f"{MAX_ZIP_BYTES // MiB} MiB uncompressed and compression ratio {MAX_ZIP_RATIO}; at most "
            f"{MAX_ROWS:,} table rows, {MAX_COLUMNS:,} columns per table, {MAX_CELLS:,} cells and "
            f"{MAX_DECODED_BYTES // MiB} MiB of decoded columns")
