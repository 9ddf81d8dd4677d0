"""First-step time of a 2-process jax.distributed job (one GPU each, fresh
caches), with and without agreement (LAZYTRITON_AGREE), for a jitted program
whose 8-config autotuned matmul goes through lazytriton.jax.triton_call.
Needs two GPUs.

A thin entry point: the measuring code is the harness's (lazytriton/bench/
distributed.py), this runs its `distributed` section and prints the table:
    python benchmarks/distributed_first_step.py [--processes N] [--out DIR]
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["distributed"], description=__doc__))
