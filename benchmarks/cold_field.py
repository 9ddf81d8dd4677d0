"""Cold first calls of kernels that live in a real package (one whose import takes
seconds: torch and jax), and the first step of a program of 16 autotuned kernels,
on both faces (issue 33): lazytriton vs in-process threads vs Triton's autotuner,
compiled ahead vs not, the warm start in a new process, and the reference (the
slowest kernel's compile + the sum of the tunes).

A thin entry point: the measuring code is the harness's (lazytriton/bench/
field.py), this runs its `field` and `field_program` sections and prints the tables:
    python benchmarks/cold_field.py [--out DIR]
For every process's numbers (per-kernel timings, each compile's trace):
    python -m lazytriton.bench.field --repeat 3 --out results.json
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["field", "field_program"], description=__doc__))
