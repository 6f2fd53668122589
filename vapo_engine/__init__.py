"""vapo-mcp engine: config, jobs, providers, diagnostics, metrics (torch-free); trainer/rollout/algo use torch."""
