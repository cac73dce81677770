"""Measured tile choices: the tuner (times candidates on the GPU), its per-GPU database, the shipped tables, the GPU timer."""
