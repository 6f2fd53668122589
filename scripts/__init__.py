"""Operational scripts of the repository, run from its root (`python -m scripts.<name>`): the GPU self-check
(`gpu_check`, with its child `gpu_step`) and the recorder of the training-diagnostics test fixtures
(`record_chain_runs`). setup.sh, test.sh and demo.sh are shell scripts.
"""
