"""First call of the 8-config autotuned matmul (2048^3 fp16), each row in a
fresh process: Triton's own autotuner cold; lazytriton standalone cold and
warm; lazytriton.jax cold (FFI handler prebuilt, and built at run time) and
warm; jax-triton cold when importable; each as a timeline of phases (lowering,
XLA compile, compile, tune, stub build, first launch). Also the tuning
quality: the config lazytriton chose vs every config, and the time choosing
took.

A thin entry point: the measuring code is the harness's (lazytriton/bench/
cold.py, throughput_group.py), this runs its `first_call` and `tuning`
sections and prints the tables:
    python benchmarks/cold_warm_start.py [--suite quick|full] [--processes N] [--out DIR]
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["first_call", "tuning"], description=__doc__))
