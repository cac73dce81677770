"""Model analysis without a GPU: which GEMMs a transformer step runs, their FLOPs and bytes, and their
roofline time on a GPU spec.

- ``gpus``: GPU specifications (datasheet peaks, bandwidth) as data
- ``models`` / ``presets`` / ``hf_config``: model hyper-parameters, built-in presets, config.json parsing
- ``ops`` / ``gemms``: one GEMM's shape and traffic; every GEMM of a prefill, decode or training step
- ``roofline`` / ``summary``: time bounds and per-phase totals
"""
