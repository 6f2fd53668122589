"""Training recipe and worker entry point (imports torch/transformers)."""
