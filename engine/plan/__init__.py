"""Where a config's weights, caches and buffers go on N devices and whether they fit (torch-free)."""
