"""Benchmarking deepgemm against cuBLAS on the GPU, and the files and charts that come out of it.

- ``suites``: named shape sets; ``inputs``: operands and float64 references; ``peers``: the implementations
- ``ceilings``: measured copy/matmul peaks (timed with ``deepgemm.tuning.timing``: CUDA graphs + L2 flush)
- ``runner``: runs it all; ``offline``: what can be done without a GPU (compile + roofline predictions)
- ``results``: the versioned JSON format; ``report`` / ``plots`` / ``compare``: tables, charts, regression gate
"""
