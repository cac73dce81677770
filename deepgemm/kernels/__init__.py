"""Kernel families, one folder each named like its device header (impls/<family>.cuh), over common/."""
