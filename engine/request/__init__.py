"""What a user asks of a run, torch-free: sampling options, decoding suggestions, interventions, the request."""
from .request import GenerationRequest
from .sampling import MAX_SEED, MIN_TEMPERATURE, SamplingParams

__all__ = ["MAX_SEED", "MIN_TEMPERATURE", "GenerationRequest", "SamplingParams"]
