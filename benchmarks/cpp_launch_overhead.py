"""Host cost per launch from C++ (lt::BundleKernel, an export-cpp typed stub)
against a raw cuLaunchKernel loop on the same cubin (goal: within 1.1x).

A thin entry point: the measuring code is the harness's (lazytriton/bench/cpp.py
builds lazytriton/bench/cpp_launch.cc against the installed package and runs
it); its rows are part of the `launch` section, which this runs and prints:
    python benchmarks/cpp_launch_overhead.py [--suite quick|full] [--processes N] [--out DIR]
"""
import sys

from lazytriton.bench.cli import script_main

if __name__ == "__main__":
    sys.exit(script_main(["launch"], description=__doc__))
