"""The DeepSeek-V4.1 forward pass in PyTorch: modules named like the checkpoint, plus real decode caches."""
from .cache import ModelCache
from .indexer_loss import IndexerLoss
from .init import init_weights
from .options import EngineOptions
from .transformer import ForwardOutput, Transformer

__all__ = ["EngineOptions", "ForwardOutput", "IndexerLoss", "ModelCache", "Transformer", "init_weights"]
