"""Benchmarking deepgemm against cuBLAS on the GPU, and the files and charts that come out of it.

- ``suites``: named shape sets; ``inputs``: operands and float64 references; ``peers``: the implementations
- ``timing``: CUDA-graph + L2-flush timing (``bench_gpu``); ``ceilings``: measured copy/matmul peaks
- ``runner``: runs it all; ``offline``: what can be done without a GPU (compile + roofline predictions)
- ``results``: the versioned JSON format; ``report`` / ``plots`` / ``compare``: tables, charts, regression gate
"""
