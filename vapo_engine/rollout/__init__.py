"""Rollouts: batched generation, log-probs, values, rewards (imports torch/transformers)."""
