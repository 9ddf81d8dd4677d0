"""Per-kernel time of a jitted chain of 32 tiny Triton kernels, side by side:
lazytriton.jax with command buffers on, on with a donated input, and off;
jax-triton when importable; XLA's own add kept unfused; and the floors: a bare
XLA FFI handler (no launch, or one plain cuLaunchKernel of the same cubin),
CUDA-graph replay of the same cubin, a raw cuLaunchKernel loop. XLA_FLAGS is
read once per process, so each command-buffer setting runs in its own
processes; the JAX process with command buffers on also times the tuned
workloads beside XLA's own ops.

A thin entry point: the measuring code is the harness's (lazytriton/bench/
jax_group.py), this runs its `chain` section and prints the tables:
    python benchmarks/jax_chain.py [--suite quick|full] [--processes N] [--out DIR]
(the same as `lazytriton bench --only chain`).
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["chain"], description=__doc__))
