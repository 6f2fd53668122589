"""Worker-side model serving: a run's checkpoint (or any Hugging Face directory) as an OpenAI-compatible
endpoint, and the local evaluation worker of `vapo-mcp eval`.

    python -m vapo_engine.serving DIR [--step N] [--port 8000] ...   (what `vapo-mcp serve-model` runs)
    python -m vapo_engine.serving.local_eval < spec.json              (what `vapo-mcp eval --run` runs)

Layout: `protocol` (the OpenAI wire format), `security` (loopback / bearer token / Host check), `source`
(run or directory → weights folder), `options` (the command line) are torch-free, so the CLI and the tools
import them; `model`, `engine`, `rows`, `app`, `server` and `local_eval` are the worker side. This package
never imports `server` or `tools`, and nothing here is imported by them at module level except the
torch-free modules named above.
"""
