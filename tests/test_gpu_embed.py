"""C++ embedding on a GPU (examples/cpp built against the installed package):
the ahead-of-time program launches the bundle's winners with no Python in the
process and gets the right results; the lazy program tunes what the bundle
lacks on its own device buffers, persists it, and a second run reuses it
without starting Python. Skipped without a GPU."""
import pytest
import triton

import lazytriton
from lazytriton import bundle
from lazytriton.cache import Cache

from test_embed import ADD, CMAKE, EXAMPLE, SCALE, cmake_build, run  # noqa: F401  (puts examples/cpp on sys.path)

import example_kernels  # noqa: E402

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
