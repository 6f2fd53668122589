"""Rollout backends: where a run's responses are sampled, behind one small interface (`base.RolloutBackend`:
prompt token ids and explicit `SamplingParams` in, a `Generation` out; `load_weights` when the policy changed).
`hf` (the default) samples in process with Hugging Face `generate`; `[rollout] backend` picks one by name
(`registry`)."""
from .base import Generation, RolloutBackend, SamplingParams
from .registry import UnknownBackendError, backend_names, get_backend, make_backend, register_backend

__all__ = ["Generation", "RolloutBackend", "SamplingParams", "UnknownBackendError", "backend_names", "get_backend",
           "make_backend", "register_backend"]
