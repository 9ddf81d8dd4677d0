"""The benchmark harness: `lazytriton bench [--suite cpu|quick|full] [--out DIR]`
(or `python -m lazytriton.bench`).

Measures lazytriton beside the systems a user would otherwise pick (Triton's
own launcher and autotuner, torch's ops) and beside the floors (a raw
cuLaunchKernel loop, CUDA-graph replay, the device's copy bandwidth and matmul
rate), in one run, rows interleaved, each section in several processes. Writes
results.json (device, versions, command, every sample), report.md (medians,
spread, ratios to the floors) and PNG plots. Without a GPU the `cpu` suite
measures what needs none: lowering time, compile time per config for sm_90,
launch-stub build time.
"""
