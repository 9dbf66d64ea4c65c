"""The Trace (trace.py) over a columnar recorder (recorder.py, columns.py); tables (tables.py, decode.py); files."""
from .formats import trace_format
from .records import FACT_FIELDS, FACT_KINDS, MHC_SITES, DSparkStep, TokenRecord, TraceBudget, layer_path, path_order
from .tables import TABLES, TraceFormatError
from .trace import Trace, load_trace, load_trace_bytes, mhc_gain, save_trace

__all__ = ["FACT_FIELDS", "FACT_KINDS", "MHC_SITES", "TABLES", "DSparkStep", "TokenRecord", "Trace", "TraceBudget",
           "TraceFormatError", "layer_path", "load_trace", "load_trace_bytes", "mhc_gain", "path_order", "save_trace",
           "trace_format"]
