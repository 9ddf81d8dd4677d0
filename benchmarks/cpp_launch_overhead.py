"""Host cost per launch from C++ against a raw cuLaunchKernel loop on the same
cubin (goal: within 1.1x). Tunes examples/cpp's add_kernel into a fresh bundle
from Python, builds benchmarks/cpp_launch_overhead/ against the installed
package, and runs it (the C++ program prints the table). On a GPU machine:

    python benchmarks/cpp_launch_overhead.py
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples" / "cpp"))


def main() -> int:
    import cupy as cp
    import triton

    import example_kernels
    import lazytriton
    from lazytriton import bundle, paths

    ok, why = lazytriton.gpu_available()
    if not ok:
        sys.exit(f"no GPU: {why}")
    work = Path(tempfile.mkdtemp(prefix="lt-cpp-bench-"))
    n = 1024
    x, y, out = (cp.random.rand(n, dtype=cp.float32) for _ in range(3))
    bundle.Bundle(work / "bundle").add(example_kernels.add_kernel, x, y, out, n,
                                       grid=lambda m: (triton.cdiv(n, m["BLOCK"]),), BLOCK=1024)
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    src, build = ROOT / "benchmarks" / "cpp_launch_overhead", work / "build"
    for cmd in ([shutil.which("cmake"), "-S", str(src), "-B", str(build), *gen, f"-Dlazytriton_DIR={paths.cmake_dir()}"],
                [shutil.which("cmake"), "--build", str(build)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(proc.stdout + proc.stderr)
    print(f"triton {triton.__version__}, lazytriton {lazytriton.__version__}")
    sys.stdout.flush()
    return subprocess.run([str(build / "cpp_launch_overhead"), str(work / "bundle")], env=os.environ).returncode


if __name__ == "__main__":
    sys.exit(main())
