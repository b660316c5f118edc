"""Profiling: measure a loaded model's forward time and swap bandwidth, and fit a policy `Profile`.

`profiler` runs the measurements, `fit` fits the cost model, `build` assembles the profile with its
provenance, and `swap` runs in the worker: the KV layout and the swap copy micro-benchmark.
"""
