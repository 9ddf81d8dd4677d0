"""What isolating a candidate's first launch in a helper process costs (issue 50): the
first call of the demo matmul and of the field package's matmul, isolation on and off,
interleaved in one run, and the helper's memory.

A thin entry point: the measuring code is the harness's (lazytriton/bench/isolation.py):
    python benchmarks/isolation_cost.py [--repeat 3] [--out results.json]
"""
import sys

from lazytriton.bench.isolation import main

if __name__ == "__main__":
    sys.exit(main())
