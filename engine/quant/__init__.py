"""The official quantized formats and the modules that keep weights in them (FP8 blocks, MXFP4, Engram rows)."""
