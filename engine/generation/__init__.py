"""Generation: the Engine facade over the plain and the DSpark speculative decoding loops, and their results."""
from ..dspark.config import DSparkConfig
from .engine import Engine, TextGeneration
from .plain import generate
from .results import EOS_ID, GenerationResult, StepInfo, check_prompts
from .speculative import SpeculativeResult, generate_speculative
from .text_stream import TextStream

__all__ = ["EOS_ID", "DSparkConfig", "Engine", "GenerationResult", "SpeculativeResult", "StepInfo", "TextGeneration",
           "TextStream", "check_prompts", "generate", "generate_speculative"]
