"""The `lazytriton` command (also `python -m lazytriton`)."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from .. import paths


def _demo(args) -> int:
    """Run an autotuned matmul lazily; without a GPU, compile its candidates for a default target."""
    import lazytriton
    from .cache import config_text
    from .. import _core
    from lazytriton.demo_kernels import DEMO_CONFIGS, demo_matmul

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    # The demo lists every config itself, once: the compiler's line per config would repeat them.
    logging.getLogger("lazytriton.compile").setLevel(logging.WARNING)
    ok, why = lazytriton.gpu_available()
    if not ok:
        return _demo_without_gpu(why, demo_matmul, DEMO_CONFIGS)
    import cupy as cp
    import numpy as np
    import triton

    M = N = K = args.size
    rng = np.random.default_rng(0)
    a = cp.asarray(rng.standard_normal((M, K)).astype(np.float16))
    b = cp.asarray(rng.standard_normal((K, N)).astype(np.float16))
    c = cp.empty((M, N), cp.float16)
    k = lazytriton.kernel(demo_matmul)
    grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))  # noqa: E731
    t0 = time.perf_counter()
    k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
    cp.cuda.runtime.deviceSynchronize()
    first = time.perf_counter() - t0
    ref = a.astype(cp.float32) @ b.astype(cp.float32)
    err = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
    ev0, ev1 = cp.cuda.Event(), cp.cuda.Event()
    ev0.record()
    for _ in range(20):
        k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
    ev1.record()
    ev1.synchronize()
    ms = cp.cuda.get_elapsed_time(ev0, ev1) / 20
    dev = _core.device_info(_core.current_device())
    rec = k.records[-1] if k.records else None
    arch = dev.get("arch") or f"sm_{dev['capability'][0]}{dev['capability'][1]}"
    print(f"\nGPU: {dev['name']} ({arch})")
    print(f"matmul {M}x{N}x{K} fp16: first call (compile/tune or cache) {first:.2f} s; "
          f"relative error {err:.1e}")
    if rec:
        for i, cand in enumerate(rec.candidates):
            t = f"{cand['time_ms']:.4f} ms" if cand["time_ms"] else (cand["error"] or "not timed")
            print(f"  config {i} {config_text(cand['config'])}: {t}{'   <- winner' if i == rec.winner_index else ''}")
    print(f"steady state: {ms * 1e3:.1f} us per call, {2 * M * N * K / ms / 1e9:.1f} TFLOP/s")
    print(f"stats: {lazytriton.stats()}")
    return 0 if err < 1e-2 else 1


def _demo_without_gpu(why: str, kernel, configs) -> int:
    from .cache import config_text
    from lazytriton.model.arrays import PointerArg
    from lazytriton.compile.compiler import Binder, Candidate, compile_all
    from lazytriton.compile.targets import default_target, target_label
    from lazytriton.model.spec import kernel_spec

    target = default_target()  # LAZYTRITON_DEFAULT_ARCH: sm_90 unless set (e.g. gfx942)
    binary = "HSACO" if target.backend == "hip" else "cubin"
    print(f"No GPU found ({why}).\nCompiling the demo's {len(configs)} matmul candidates to {binary} for "
          f"{target_label(target)} instead (no launch):")
    spec = kernel_spec(kernel)
    binder = Binder(spec, target)
    M = N = K = 2048
    ptr = PointerArg(1 << 20, "fp16")
    args = (ptr, ptr, ptr, M, N, K, K, 1, N, 1, N, 1)
    cands = [Candidate(i, c, binder.bind(args, c.all_kwargs())) for i, c in enumerate(configs)]
    t0 = time.perf_counter()
    compile_all(spec, target, cands)
    print(f"compiled in {time.perf_counter() - t0:.1f} s:")
    for c in cands:
        if c.binary:
            md = c.binary.metadata
            print(f"  config {c.index} {config_text(c.config)}: {binary} {len(c.binary.cubin)} B, shared {md.get('shared')} B, "
                  f"num_warps {md.get('num_warps')}")
        else:
            print(f"  config {c.index} {config_text(c.config)}: failed: {c.error}")
    if not any(c.binary for c in cands):
        print(f"None of the {len(cands)} candidates compiled for {target_label(target)}: the demo failed (the errors "
              "are above; LAZYTRITON_DEFAULT_ARCH names the target).", file=sys.stderr)
        return 1
    print("On a GPU machine this demo tunes these on real inputs and launches the winner.")
    return 0


def _export_cpp(args) -> int:
    from ..cpp.export import cli_main  # imported on use: it imports Triton

    return cli_main(args)


def _bundle(args) -> int:
    from ..cpp.bundle import cli_list

    return cli_list(args)


def _add_cpp_commands(sub) -> None:
    """`export-cpp` (typed C++ launch functions) and `bundle` (list a bundle's winners)."""
    p = sub.add_parser("export-cpp", help="write a typed C++ launch function (header + source) for a kernel")
    p.add_argument("kernel", help="the kernel as module:function")
    p.add_argument("--signature", required=True, help='runtime argument types, e.g. "*fp32,*fp32,i32"')
    p.add_argument("--constexpr", action="append", default=[], metavar="NAME=VALUE",
                   help="a constexpr argument or compile option (repeatable)")
    p.add_argument("--function", default=None, help="name of the launch function (default launch_<kernel>)")
    p.add_argument("--out-dir", default=".", help="where to write <function>.h and <function>.cc")
    p.add_argument("--path", action="append", default=[], help="directory to import the kernel's module from")
    p.set_defaults(func=_export_cpp)
    p = sub.add_parser("bundle", help="list the tuned winners in a C++ bundle")
    p.add_argument("dir", nargs="?", default=None, help="the bundle (default: the one in lazytriton's cache)")
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(func=_bundle)


def main(argv: list[str] | None = None) -> int:
    from .. import __version__

    parser = argparse.ArgumentParser(prog="lazytriton", description=__doc__)
    parser.add_argument("--version", action="version", version=f"lazytriton {__version__}")
    parser.add_argument("--cmake-dir", action="store_true", help="print the directory of lazytritonConfig.cmake")
    parser.add_argument("--include-dir", action="store_true", help="print the C++ include directory")
    sub = parser.add_subparsers(dest="command")
    demo = sub.add_parser("demo", help="run an autotuned kernel lazily and show what was tuned")
    demo.add_argument("--size", type=int, default=2048)
    demo.set_defaults(func=_demo)
    from .cache import add_cache_commands, add_pretune_command

    add_cache_commands(sub)
    add_pretune_command(sub)
    from ..bench import cli as bench_cli

    bench = sub.add_parser("bench", help="benchmark lazytriton beside Triton, torch and the floors; "
                                         "writes results.json, report.md and plots")
    bench_cli.add_arguments(bench)
    bench.set_defaults(func=bench_cli.run)
    _add_cpp_commands(sub)
    args = parser.parse_args(argv)
    if args.cmake_dir:
        if not (paths.cmake_dir() / "lazytritonConfig.cmake").exists():
            print(f"error: no lazytritonConfig.cmake in {paths.cmake_dir()} (is lazytriton installed with pip?)",
                  file=sys.stderr)
            return 1
        print(paths.cmake_dir())
        return 0
    if args.include_dir:
        print(paths.include_dir())
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from ..settings import SettingError

    try:
        rc = args.func(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, not at exit
        return rc
    except SettingError as exc:  # a LAZYTRITON_* variable of the environment, named: no traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`| head`): stop quietly, as Unix tools do
        _quiet_stdout()
        return 141  # 128 + SIGPIPE, a shell's status for a command a pipe cut short


def _quiet_stdout() -> None:
    # Python flushes stdout at exit and would fail again on the closed pipe: point it at /dev/null.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
