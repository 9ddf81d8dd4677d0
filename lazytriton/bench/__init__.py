"""The benchmark harness: `lazytriton bench [--suite cpu|quick|full] [--out DIR]
[--processes N] [--only SECTIONS] [--dry-run]` (or `python -m lazytriton.bench`).

Measures lazytriton beside what a user would otherwise pick (Triton's own
launcher and autotuner, torch's ops, XLA's ops, jax-triton when importable)
and beside the floors (a raw cuLaunchKernel loop, CUDA-graph replay of the
same cubin, a bare XLA FFI handler, the device's copy bandwidth and matmul
rate), in one run: each process group (plan.py) runs in several fresh
processes, round-robin, and rows are interleaved within a process
(timing.interleaved, the one timing loop). Writes results.json (device,
versions, command, every sample), report.md (medians, spread, ratios to the
floors) and PNG plots (report.py). Without a GPU the `cpu` suite measures what
needs none: lowering time, compile time per config for sm_90, launch-stub
build time.

Modules: plan (what a suite runs), cli (the runner), torch_group (launch cost,
launch-bound sizes), cpp (the C++ rows), throughput_group (tuned workloads,
tuning quality), jax_group (32-kernel chain, JAX workloads), cold (first-call
timelines), distributed (2-GPU first step), cpu, workloads, kernels, report.
The scripts in benchmarks/ are thin entry points to these.
"""
