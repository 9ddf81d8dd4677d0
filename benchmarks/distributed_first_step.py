"""First-step time of a jax.distributed job of 2 and of 4 processes (fresh
caches per rank, as separate hosts would have), with and without agreement
(LAZYTRITON_AGREE), for a jitted program whose 8-config autotuned matmul goes
through lazytriton.jax.triton_call. Ranks share the GPUs round-robin: on a
one-GPU machine every rank runs on GPU 0.

A thin entry point: the measuring code is the harness's (lazytriton/bench/
distributed.py), this runs its `distributed` section and prints the table:
    python benchmarks/distributed_first_step.py [--out DIR]
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["distributed"], description=__doc__))
