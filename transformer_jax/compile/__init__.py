"""Compiling an experiment for TPU slices and NVIDIA GPUs on a CPU: targets, per-program memory
and cost, and the report of `--mode=compile`."""
