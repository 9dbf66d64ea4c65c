"""Where a model's tensors live: the routed experts in host memory and on the host's CPU, the rest on the device."""
from .allocate import allocate, build_model
from .host_experts import HOST, HostExpertsMoE, has_host_experts, place_experts, prepare_model, refuse_host_experts

__all__ = ["HOST", "HostExpertsMoE", "allocate", "build_model", "has_host_experts", "place_experts", "prepare_model",
           "refuse_host_experts"]
