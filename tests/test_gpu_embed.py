"""C++ embedding on a GPU (examples/cpp built against the installed package):
the ahead-of-time program launches the bundle's winners with no Python in the
process and gets the right results; the lazy program tunes what the bundle
lacks on its own device buffers, persists it, and a second run reuses it
without starting Python. Skipped without a GPU."""
import ctypes
import struct

import numpy as np
import pytest
import triton

import lazytriton
from lazytriton.cpp import bundle
from lazytriton.model.arrays import PointerArg
from lazytriton.cache import Cache

from test_embed import (ADD, API_CMAKE, CMAKE, EXAMPLE, SCALE, STORE_SIG, cmake_build, cpp_arg,  # noqa: F401
                        run)  # (test_embed puts examples/cpp on sys.path)

import example_kernels  # noqa: E402
from kernels import annotated  # noqa: E402

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

N = (1 << 20) + 3  # not a multiple of 16 or of any block: masks and the i32 spec are exercised


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    build = tmp_path_factory.mktemp("example-build")
    cmake_build(EXAMPLE, build)
    return build


def tune_into(d, n=N) -> bundle.Bundle:
    """Tune both example kernels from Python on CuPy arrays and write the winners."""
    x, y = cp.random.rand(n, dtype=cp.float32), cp.random.rand(n, dtype=cp.float32)
    out, out2 = cp.empty_like(x), cp.empty_like(x)
    grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
    b = bundle.Bundle(d)
    b.add(example_kernels.add_kernel, x, y, out, n, grid=grid, BLOCK=1024)
    b.add(example_kernels.scale_kernel, out, out2, 2.5, n, grid=grid)  # resolves (tunes) without launching
    return b


def test_aot_example_is_correct_with_no_python_loaded(example, tmp_path, cache_dir):
    b = tune_into(tmp_path / "bundle")
    (scale,) = b.variants(SCALE)
    assert scale["key_values"] == {"n": N} and scale["signature"] == "*fp32:16,*fp32:16,fp32,i32"
    out = run(example / "vector_add_aot", tmp_path / "bundle", N, env={"LD_DEBUG": "libs"})
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert f"n={N}: ok (0 wrong)" in out.stdout
    assert f"BLOCK={scale['meta']['BLOCK']} num_warps={scale['launch']['num_warps']}" in out.stdout
    assert "bundle resolutions: 2" in out.stdout
    assert "libcuda.so.1" in out.stderr and "libpython" not in out.stderr  # LD_DEBUG lists dlopen()s too


def test_aot_example_without_a_winner_for_this_n_is_a_clear_error(example, tmp_path, cache_dir):
    tune_into(tmp_path / "bundle")
    out = run(example / "vector_add_aot", tmp_path / "bundle", N + 16)  # same specialization, another key
    assert out.returncode == 2, out.stdout + out.stderr
    assert "error: kernel scale_kernel: no tuned winner in bundle" in out.stderr
    assert f"*fp32:16,*fp32:16,fp32,i32 n={N + 16}; its winners are:" in out.stderr
    assert f"n={N} (tuned on " in out.stderr


def test_lazy_example_tunes_persists_and_reuses(example, tmp_path, cache_dir):
    lazy = example / "vector_add_lazy"
    if not lazy.exists():
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    d = tmp_path / "bundle"
    first = run(lazy, d, N)
    assert first.returncode == 0, first.stdout + first.stderr[-4000:]
    assert f"n={N}: ok (0 wrong)" in first.stdout
    assert "python: started, python resolutions: 2" in first.stdout
    assert sorted(v["kernel"] for v in bundle.Bundle(d).variants()) == [ADD, SCALE]
    # tuned as in the Python path: every config timed on the C++ buffers, the record persisted
    (rec,) = [e for e in Cache(cache_dir).entries() if e.kind == "record" and e.kernel_name == "scale_kernel"]
    full = Cache(cache_dir).show(rec.key)["record"]
    assert len([c for c in full["candidates"] if c["time_ms"]]) == 4, full["candidates"]

    second = run(lazy, d, N)
    assert second.returncode == 0, second.stdout + second.stderr[-4000:]
    assert "python: not started, python resolutions: 0" in second.stdout
    aot = run(example / "vector_add_aot", d, N)
    assert aot.returncode == 0 and f"n={N}: ok (0 wrong)" in aot.stdout, aot.stdout + aot.stderr


def test_bundle_add_reuses_the_python_paths_tuning(tmp_path, cache_dir):
    n = 50_000
    x, out = cp.random.rand(n, dtype=cp.float32), cp.empty(n, cp.float32)
    grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
    lazytriton.kernel(example_kernels.scale_kernel)[grid](x, out, 2.0, n)
    before = lazytriton.stats()
    v = bundle.Bundle(tmp_path).add(example_kernels.scale_kernel, x, out, 2.0, n, grid=grid)
    after = lazytriton.stats()
    assert after["tunes"] == before["tunes"] and after["record_hits"] == before["record_hits"] + 1
    assert v["key_values"] == {"n": n} and v["device"] == lazytriton._core.device_info(0)["name"]


THREADS_TEST = r"""
#include <lazytriton/embed.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

// Eight threads make the same first call at once, each on its own buffers:
// one tunes (through Python), the others wait for its winner; all results right.
int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  lt::enable_lazy(b, {{argv[2]}});
  lt::BundleKernel k = b.kernel("example_kernels:scale_kernel", "*fp32,*fp32,fp32,i32");
  const lt::Driver& d = lt::driver();
  lt::cu::CUcontext ctx = lt::current_context();
  const int n = 100000, threads = 8;
  std::atomic<int> wrong{0}, ready{0};
  std::vector<std::string> errors(threads);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        lt::check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
        std::vector<float> hx(n), hout(n);
        for (int i = 0; i < n; ++i) hx[i] = float(t + i % 5);
        lt::cu::CUdeviceptr x, out;
        lt::check(d.cuMemAlloc(&x, n * 4), "cuMemAlloc");
        lt::check(d.cuMemAlloc(&out, n * 4), "cuMemAlloc");
        lt::check(d.cuMemcpyHtoDAsync(x, hx.data(), n * 4, nullptr), "cuMemcpyHtoDAsync");
        lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
        ++ready;
        while (ready < threads) std::this_thread::yield();
        k.launch(nullptr, [&](const lt::Meta& m) { return lt::Dim3{unsigned((n + m["BLOCK"] - 1) / m["BLOCK"])}; },
                 {lt::DevicePtr(x), lt::DevicePtr(out), 2.0f, n});
        lt::check(d.cuMemcpyDtoHAsync(hout.data(), out, n * 4, nullptr), "cuMemcpyDtoHAsync");
        lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
        for (int i = 0; i < n; ++i) wrong += hout[i] != hx[i] * 2.0f;
        d.cuMemFree(x);
        d.cuMemFree(out);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (!e.empty()) std::printf("error: %s\n", e.c_str());
  std::printf("wrong: %d\n", wrong.load());
  std::printf("python resolutions: %llu\n", (unsigned long long)lt::lazy_stats().resolutions);
}
"""


def test_lazy_first_calls_from_many_threads_tune_once(tmp_path, cache_dir):
    src = tmp_path / "src"
    src.mkdir()
    (src / "threads_test.cc").write_text(THREADS_TEST)
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\nproject(t LANGUAGES CXX)\nset(CMAKE_CXX_STANDARD 17)\n"
        "find_package(lazytriton CONFIG REQUIRED)\nif(NOT TARGET lazytriton::embed)\n  return()\nendif()\n"
        "find_package(Threads REQUIRED)\nadd_executable(threads_test threads_test.cc)\n"
        "target_link_libraries(threads_test PRIVATE lazytriton::embed Threads::Threads)\n")
    cmake_build(src, tmp_path / "build")
    exe = tmp_path / "build" / "threads_test"
    if not exe.exists():
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    out = run(exe, tmp_path / "bundle", EXAMPLE)
    assert out.returncode == 0, out.stdout + out.stderr[-4000:]
    assert "error:" not in out.stdout, out.stdout
    assert "wrong: 0" in out.stdout and "python resolutions: 1" in out.stdout, out.stdout


# -- annotated scalars through the bundle: packed as Triton's launcher packs them ------------------

# (h: fp16, b: bf16, f: fp32, d: fp64, n: i64), all one specialization (n never % 16).
SCALAR_ROWS = [
    # fp16 rounds up straight from the double (from float(h) it would tie down to 1.0); bf16 is
    # truncated to 1.0 (rounded: 1.0078125); the annotated n == 1 stays a parameter
    (1 + 2**-11 + 2**-40, 1.005, 0.1, 1 / 3, 1),
    # ints for the floats: fp16 2049 ties to 2048, bf16 259 truncates to 258 (rounded: 260), fp32 2**24, fp64 2**53
    (2049, 259, 2**24 + 1, 2**53 + 1, 3),
    # fp16 -65519 rounds to -65504 (its largest); bf16 truncates toward zero (rounded: -1.015625); bools as numbers
    (-65519.0, -1.01171875, True, False, True),
    # an fp16 subnormal (2**-24); bf16 of a large fp32; -0.0; a double beyond fp32
    (6e-8, 3.0e38, -0.0, 1e300, 7),
]

SCALARS_TEST = r"""
#include <lazytriton/bundle.h>

#include <cstdio>
#include <exception>
#include <string>
#include <vector>

// An error message on one output line (a "no winner" error lists the bundle's winners).
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n') c = ' ';
  return s;
}

// store_scalars once per row (the values Python launched with), printing the bits
// the kernel stored; then scale_fp16_kernel, whose winner is chosen by alpha.
int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  lt::BundleKernel k = b.kernel("kernels.annotated:store_scalars", "STORE_SIG");
  const lt::Driver& d = lt::driver();
  lt::current_context();
  lt::cu::CUdeviceptr out, out64;
  lt::check(d.cuMemAlloc(&out, 3 * 4), "cuMemAlloc");
  lt::check(d.cuMemAlloc(&out64, 2 * 8), "cuMemAlloc");
  auto store = [&](const char* label, std::initializer_list<lt::Arg> scalars) {
    std::vector<lt::Arg> args = {lt::DevicePtr(out), lt::DevicePtr(out64)};
    args.insert(args.end(), scalars);
    uint32_t f[3] = {0, 0, 0};
    unsigned long long g[2] = {0, 0};
    try {
      lt::check(d.cuMemsetD32Async(out, 0, 3, nullptr), "cuMemsetD32Async");
      lt::check(d.cuMemsetD32Async(out64, 0, 4, nullptr), "cuMemsetD32Async");
      k.launch(nullptr, lt::Dim3{1}, args.data(), args.size());
      lt::check(d.cuMemcpyDtoHAsync(f, out, sizeof f, nullptr), "cuMemcpyDtoHAsync");
      lt::check(d.cuMemcpyDtoHAsync(g, out64, sizeof g, nullptr), "cuMemcpyDtoHAsync");
      lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    } catch (const std::exception& e) {
      std::printf("%s: error: %s\n", label, one_line(e.what()).c_str());
      return;
    }
    std::printf("%s: %u %u %u %llu %llu\n", label, f[0], f[1], f[2], g[0], g[1]);
  };
  ROWS
  store("overflow", {65520.0, 1.0, 1.0, 1.0, 3});

  lt::BundleKernel s = b.kernel("kernels.annotated:scale_fp16_kernel", "*fp32,*fp32,fp16,i32");
  const int n = 1000;
  std::vector<float> hx(n), hy(n);
  for (int i = 0; i < n; ++i) hx[i] = 0.25f * float(i);
  lt::cu::CUdeviceptr x, y;
  lt::check(d.cuMemAlloc(&x, n * 4), "cuMemAlloc");
  lt::check(d.cuMemAlloc(&y, n * 4), "cuMemAlloc");
  lt::check(d.cuMemcpyHtoDAsync(x, hx.data(), n * 4, nullptr), "cuMemcpyHtoDAsync");
  auto grid = [](const lt::Meta& m) { return lt::Dim3{unsigned((1000 + m["BLOCK"] - 1) / m["BLOCK"])}; };
  auto scale = [&](const char* label, lt::Arg alpha, float want) {
    try {
      s.launch(nullptr, grid, {lt::DevicePtr(x), lt::DevicePtr(y), alpha, n});
      lt::check(d.cuMemcpyDtoHAsync(hy.data(), y, n * 4, nullptr), "cuMemcpyDtoHAsync");
      lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    } catch (const std::exception& e) {
      std::printf("%s: error: %s\n", label, one_line(e.what()).c_str());
      return;
    }
    int wrong = 0;
    for (int i = 0; i < n; ++i) wrong += hy[i] != hx[i] * want;
    std::printf("%s: %d wrong\n", label, wrong);
  };
  scale("alpha 3.0", 3.0, 3.0f);
  scale("alpha int 3", 3, 3.0f);  // the winner recorded for 3: keyed by the converted double
  scale("alpha 2.5", 2.5, 2.5f);  // never tuned
}
"""


def f32_bits(x: float) -> int:
    return int.from_bytes(bytes(ctypes.c_float(x)), "little")  # C's double -> float, as the launcher converts


def f64_bits(x: float) -> int:
    return struct.unpack("<Q", struct.pack("<d", x))[0]


def reference_bits(row) -> tuple:
    """What store_scalars stores when each scalar is packed by Triton's rules:
    fp16 by PyFloat_Pack2 (struct's "e"), bf16 the fp32's top half."""
    h, b, f, d, n = row
    half = struct.unpack("<e", struct.pack("<e", float(h)))[0]
    return f32_bits(half), f32_bits(float(b)) >> 16 << 16, f32_bits(float(f)), f64_bits(float(d)), f64_bits(float(n))


def launch_bits(launch, out, out64) -> tuple:
    """The bits one launch stores into out (3 fp32) and out64 (2 fp64)."""
    out.fill(0)
    out64.fill(0)
    launch()
    cp.cuda.Device().synchronize()
    return (*out.get().view(np.uint32).tolist(), *out64.get().view(np.uint64).tolist())


@pytest.fixture(scope="module")
def scalars_run(tmp_path_factory) -> dict:
    """Winners written from Python (ints for the float parameters, n == 1, alpha = 3),
    then each row launched through the C++ bundle and through lazytriton's Python stubs."""
    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    import lazytriton.cache.store as store

    tmp = tmp_path_factory.mktemp("scalars")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAZYTRITON_CACHE_DIR", str(tmp / "ltcache"))
        mp.setattr(store, "_default", None)
        out, out64 = cp.zeros(3, cp.float32), cp.zeros(2, cp.float64)
        b = bundle.Bundle(tmp / "bundle")
        for row in SCALAR_ROWS[:2]:  # n == 1 (a parameter, annotated), then ints for the floats: one variant
            b.add(annotated.store_scalars, out, out64, *row, grid=(1,))
        x = cp.arange(1000, dtype=cp.float32) * 0.25
        grid = lambda m: (triton.cdiv(1000, m["BLOCK"]),)  # noqa: E731
        b.add(annotated.scale_fp16_kernel, x, cp.empty_like(x), 3, 1000, grid=grid)  # alpha = 3: keyed as 3.0
        k = lazytriton.kernel(annotated.store_scalars)
        python = [launch_bits(lambda: k[(1,)](out, out64, *row), out, out64) for row in SCALAR_ROWS]
    rows = "\n  ".join(f'store("row{i}", {{{", ".join(map(cpp_arg, r))}}});' for i, r in enumerate(SCALAR_ROWS))
    src = tmp / "src"
    src.mkdir()
    (src / "api_test.cc").write_text(SCALARS_TEST.replace("STORE_SIG", STORE_SIG).replace("ROWS", rows))
    (src / "CMakeLists.txt").write_text(API_CMAKE)
    cmake_build(src, tmp / "build")
    proc = run(tmp / "build" / "api_test", tmp / "bundle")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    bad = {k: v for k, v in lines.items() if k.startswith("row") and v.startswith("error")}
    assert not bad, bad
    cpp = [tuple(int(w) for w in lines[f"row{i}"].split()) for i in range(len(SCALAR_ROWS))]
    return {"cpp": cpp, "python": python, "lines": lines}


def test_bundle_packs_annotated_scalars_by_tritons_rules(scalars_run):
    cpp = scalars_run["cpp"]
    assert cpp == [reference_bits(r) for r in SCALAR_ROWS]
    assert cpp == scalars_run["python"]  # the Python stubs pack the same bytes
    # what the rows are for: fp16 rounded from the double, bf16 truncated, ints and bools converted
    assert cpp[0][:2] == (f32_bits(1 + 2**-10), f32_bits(1.0))
    assert cpp[1][1] == f32_bits(258.0) and cpp[2][:2] == (f32_bits(-65504.0), f32_bits(-1.0078125))
    assert cpp[2][2:] == (f32_bits(1.0), f64_bits(0.0), f64_bits(1.0))


def test_bundle_fp16_overflow_and_float_keys(scalars_run):
    lines = scalars_run["lines"]
    assert lines["overflow"] == ("error: kernel store_scalars: argument h: 65520.0 does not fit fp16 (it rounds "
                                 "beyond 65504; Triton's launcher raises OverflowError)")
    assert lines["alpha 3.0"] == "0 wrong" and lines["alpha int 3"] == "0 wrong"
    assert "no tuned winner" in lines["alpha 2.5"] and "alpha=2.5" in lines["alpha 2.5"]


def test_bundle_packs_annotated_scalars_as_tritons_launcher(scalars_run):
    try:
        triton.runtime.driver.active.get_current_device()
    except ImportError as exc:  # Triton before 3.9 launches only with PyTorch
        pytest.skip(f"Triton's own launcher cannot run here: {exc}")
    out, out64 = cp.zeros(3, cp.float32), cp.zeros(2, cp.float64)
    ptrs = PointerArg(out.data.ptr, "fp32"), PointerArg(out64.data.ptr, "fp64")  # data_ptr() and dtype
    theirs = [launch_bits(lambda: annotated.store_scalars[(1,)](*ptrs, *row), out, out64) for row in SCALAR_ROWS]
    assert scalars_run["cpp"] == theirs
    with pytest.raises(OverflowError):
        annotated.store_scalars[(1,)](*ptrs, 65520.0, 1.0, 1.0, 1.0, 3)
