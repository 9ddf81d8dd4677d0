"""The C++ rows of the launch section: host cost per launch of a bundle's
winner through lt::BundleKernel and an export-cpp typed stub, beside a raw
cuLaunchKernel loop on the same cubin, measured by cpp_launch.cc (a C++
program: these launches have no Python in them).

build() needs no GPU (export-cpp and a C++ compiler); make_bundle() tunes the
kernel into a bundle on the GPU; measure() runs the program."""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path

KERNEL, SIGNATURE, FUNCTION = "lazytriton.bench.kernels:add", "*fp32,*fp32,*fp32,i32", "launch_bench_add"
N = 1024
# The program's paths, in its order (cpp_launch.cc), and their kinds.
PATHS = [("raw cuLaunchKernel loop", "floor"), ("lt::Kernel::launch (core)", "lazytriton"),
         ("BundleKernel::launch(Dim3)", "lazytriton"), ("BundleKernel::launch(grid fn)", "lazytriton"),
         ("typed stub launch_bench_add(k, ...)", "lazytriton"), ("typed stub, default bundle", "lazytriton")]
PREFIX = "C++ program: "


def source() -> Path:
    return Path(__file__).with_name("cpp_launch.cc")


def build(work: Path) -> Path:
    """The program, built once per source and lazytriton install under `work`."""
    from lazytriton.cpp import export as export_cpp
    from lazytriton import paths

    lib = paths.runtime_library()
    tag = hashlib.sha256(source().read_bytes() + str(lib).encode() + str(lib.stat().st_mtime_ns).encode()).hexdigest()
    d = Path(work) / f"cpp-launch-{tag[:12]}"
    prog = d / "cpp_launch"
    if prog.exists():
        return prog
    d.mkdir(parents=True, exist_ok=True)
    export_cpp.export(KERNEL, SIGNATURE, {"BLOCK": 1024}, d, FUNCTION)
    tmp = d / f"cpp_launch.{os.getpid()}.tmp"
    cmd = [*shlex.split(os.environ.get("CXX", "c++")), "-O2", "-std=c++17", f"-I{paths.include_dir()}", f"-I{d}",
           str(source()), str(d / f"{FUNCTION}.cc"), "-o", str(tmp), f"-L{lib.parent}", "-llazytriton",
           f"-Wl,-rpath,{lib.parent}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the C++ launch benchmark failed:\n{' '.join(cmd)}\n{proc.stderr[-3000:]}")
    os.replace(tmp, prog)
    return prog


def make_bundle(directory: Path) -> Path:
    """The kernel tuned (or taken from lazytriton's cache) into a bundle, on the GPU."""
    import torch
    import triton

    from lazytriton.cpp import bundle

    from .kernels import add

    x, y, out = (torch.randn(N, device="cuda") for _ in range(3))
    bundle.Bundle(directory).add(add, x, y, out, N, grid=lambda m: (triton.cdiv(N, m["BLOCK"]),), BLOCK=1024)
    torch.cuda.synchronize()
    return Path(directory)


def measure(prog: Path, bundle_dir: Path, rounds: int, batch: int) -> dict:
    """The program's JSON: {"device", "winner", "batch", "rounds", "paths": [{"name", "us"}]}."""
    proc = subprocess.run([str(prog), str(bundle_dir), str(rounds), str(batch)], capture_output=True, text=True,
                          timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{prog.name} failed (exit {proc.returncode}): {proc.stderr.strip()[-1000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    names = [p["name"] for p in out["paths"]]
    if names != [n for n, _ in PATHS]:
        raise RuntimeError(f"{prog.name} measured {names}, expected {[n for n, _ in PATHS]}")
    return out


def rows(result: dict) -> list[dict]:
    from .common import row

    kinds = dict(PATHS)
    return [row(PREFIX + p["name"], kinds[p["name"]], p["us"]) for p in result["paths"]]
