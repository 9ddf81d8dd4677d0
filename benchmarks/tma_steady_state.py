"""Steady state of kernels taking host TMA descriptors: Triton's tutorial 09
(persistent matmul) and tutorial 06 (fused attention forward, host
descriptors), each autotuned through its config pre_hooks. lazytriton (the
descriptors encoded in C++ on every call) beside Triton's own launch of the
config lazytriton chose ("Triton, same config"), Triton's own autotuner and
torch's op: kernel time at 4096^3 / 4x32x2048x128 (throughput section) and
time per call back to back at 512^3 / 1x4x512x64 (small section).

A thin entry point: the measuring code is the harness's (lazytriton/bench/
workloads.py, throughput_group.py, torch_group.py):
    python benchmarks/tma_steady_state.py [--suite quick|full] [--processes N] [--out DIR]
(the same as `lazytriton bench --only throughput,small --workloads "TMA,attention"`).
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["throughput", "small"], description=__doc__, workloads="TMA,attention"))
