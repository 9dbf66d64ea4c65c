"""The DeepSeek-V4.1 forward pass in PyTorch: modules named like the checkpoint, plus real decode caches."""
