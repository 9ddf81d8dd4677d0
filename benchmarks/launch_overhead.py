"""Host cost per launch of a tiny kernel (vector add, 1024 elements), side by
side in one run: lazytriton's Python paths (torch and CuPy arrays, with and
without keywords and stream=, k.run), its C++ core loop, Triton's own
launcher, the C++ program's rows (bundle launch, typed stub) and the floors (a
raw cuLaunchKernel loop, CUDA-graph replay of the same cubin); also the
launch-bound sizes of the workloads.

A thin entry point: the measuring code is the harness's (lazytriton/bench/
torch_group.py and cpp.py), this runs its `launch` section and prints the table:
    python benchmarks/launch_overhead.py [--suite quick|full] [--processes N] [--out DIR]
(the same as `lazytriton bench --only launch`).
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["launch"], description=__doc__))
