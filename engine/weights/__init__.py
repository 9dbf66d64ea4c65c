"""The learned parameters of a checkpoint folder, read lazily as statistics per diagram box: the reader (headers at
once, tensors on demand, every byte counted), the views (router, mHC, attention sinks, norms, Engram, DSpark), the
opt-in expert norms with their cache, the comparison of two folders and the table export."""
