"""One-pass FP8 quantizers, per token group and per 128x128 block (impls/quantize_fp8.cuh)."""
