"""Tuple arguments (issue 10) on a GPU, on every face: standalone (CuPy and
torch), lazytriton.jax.triton_call under jax.jit with command buffers forced
on (conftest.py), and C++ bundles (ahead of time, and lazy mode through the
embedded Python). Fresh random data, outputs poisoned first, numpy references.

tuple_kernels.nested_axpy overwrites a tuple element (ptrs[1][0] = x) after
reading it: if tuning did not save and restore that element around its trials,
`out` would be computed from x instead of the caller's y."""
import numpy as np
import pytest
import triton

import lazytriton
from lazytriton.cpp import bundle

from kernels import tuple_kernels as tk
from test_embed import CMAKE, cmake_build, run

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

N = (1 << 18) + 5  # no block divides it, not % 16: masks exercised


def grid_of(n):
    return lambda m: (triton.cdiv(n, m["BLOCK"]),)


def fresh(n, seed=None):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def axpy_reference(x, y, alpha, flag):
    out = np.float64(alpha) * x.astype(np.float64) + (y.astype(np.float64) if flag else 0.0)
    return out.astype(np.float32)


def check(got, want, what):
    got = np.asarray(got)
    assert not np.isnan(got).any(), f"{what}: NaN left (elements never written)"
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=what)


# -- standalone --------------------------------------------------------------------------------


def test_standalone_cupy_pair_and_nested_autotuned(cache_dir):
    hx, hy = fresh(N)
    scale = float(np.random.default_rng().uniform(0.5, 2.0))
    x, y = cp.asarray(hx), cp.asarray(hy)
    out = cp.full(N, cp.nan, dtype=cp.float32)
    add = lazytriton.kernel(tk.add_pair)
    add[grid_of(N)]((x, (y, scale)), out, N, BLOCK=256)
    check(out.get(), (hx.astype(np.float64) + hy.astype(np.float64) * np.float32(scale)).astype(np.float32),
          "add_pair")
    # Later calls: the generated or table-driven stub reads the tuple, no new resolution.
    resolves = lazytriton.stats()["resolves"]
    hx2, hy2 = fresh(N)
    x2, y2 = cp.asarray(hx2), cp.asarray(hy2)
    out.fill(cp.nan)
    for _ in range(3):
        add[grid_of(N)]((x2, (y2, scale)), out, N, BLOCK=256)
    check(out.get(), (hx2.astype(np.float64) + hy2.astype(np.float64) * np.float32(scale)).astype(np.float32),
          "add_pair, later calls")
    assert lazytriton.stats()["resolves"] == resolves

    axpy = lazytriton.kernel(tk.nested_axpy)
    for flag in (True, False):
        hx, hy = fresh(N)
        alpha = float(np.random.default_rng().uniform(-2.0, 2.0))
        x, y = cp.asarray(hx), cp.asarray(hy)
        out = cp.full(N, cp.nan, dtype=cp.float32)
        tunes = lazytriton.stats()["tunes"]
        axpy[grid_of(N)]((x, (y, out)), (N, (alpha, flag)))
        assert lazytriton.stats()["tunes"] == tunes + 1  # the key names the tuple: a new flag tunes again
        check(out.get(), axpy_reference(hx, hy, alpha, flag), f"nested_axpy flag={flag} (one launch on the original y)")
        check(y.get(), hx, "the tuple element the kernel writes")
    rec = axpy.records[-1]
    assert rec.extra["launch"]["is_param"] == [True, True, True, True, True, True]
    # A new process-like kernel object finds the persisted winner: no compile, no tuning.
    hits = lazytriton.stats()["record_hits"]
    again = lazytriton.kernel(tk.nested_axpy)
    hx, hy = fresh(N)
    x, y, out = cp.asarray(hx), cp.asarray(hy), cp.full(N, cp.nan, dtype=cp.float32)
    again[grid_of(N)]((x, (y, out)), (N, (alpha, False)))
    assert lazytriton.stats()["record_hits"] == hits + 1
    check(out.get(), axpy_reference(hx, hy, alpha, False), "nested_axpy from the persisted winner")


def test_standalone_torch(cache_dir):
    torch = pytest.importorskip("torch")
    hx, hy = fresh(N)
    x, y = torch.from_numpy(hx).cuda(), torch.from_numpy(hy).cuda()
    out = torch.full((N,), float("nan"), device="cuda")
    s = torch.cuda.current_stream().cuda_stream
    alpha = float(np.random.default_rng().uniform(-2.0, 2.0))
    axpy = lazytriton.kernel(tk.nested_axpy)
    axpy[grid_of(N)]((x, (y, out)), (N, (alpha, True)), stream=s)
    torch.cuda.synchronize()
    check(out.cpu().numpy(), axpy_reference(hx, hy, alpha, True), "nested_axpy on torch tensors")
    check(y.cpu().numpy(), hx, "the written tuple element (torch)")
    add = lazytriton.kernel(tk.add_pair)
    out.fill_(float("nan"))
    add[grid_of(N)]((x, (y, 0.5)), out, N, BLOCK=512, stream=s)
    torch.cuda.synchronize()
    check(out.cpu().numpy(), (hx.astype(np.float64) * 1.5).astype(np.float32), "add_pair on torch tensors (y = x now)")
    with pytest.raises((TypeError, ValueError), match=r"kernel add_pair, argument xs\[1\]\[0\]"):
        add[grid_of(N)]((x, (y.cpu(), 0.5)), out, N, BLOCK=512, stream=s)  # a host tensor inside the tuple


# -- JAX ---------------------------------------------------------------------------------------


def test_jax_tuples_under_jit_with_command_buffers(jax_gpu, cache_dir):
    jax = jax_gpu
    import jax.numpy as jnp
    from lazytriton import jax as ltj

    def add(x, y, scale):
        return ltj.triton_call((x, (y, scale)), kernel=tk.add_pair, out_type=x, n=x.size, grid=grid_of(x.size),
                               BLOCK=256)

    def axpy_refs(x, y, alpha):  # y and out are Refs inside the tuple: updated in place
        ry, ro = jax.new_ref(y), jax.new_ref(jnp.full(x.shape, jnp.nan, x.dtype))
        ltj.triton_call((x, (ry, ro)), (x.size, (alpha, True)), kernel=tk.nested_axpy, out_type=(),
                        grid=grid_of(x.size))
        return ro[...], ry[...]

    def axpy_aliases(x, y, o, alpha):  # operands: x 0, y 1, o 2, n 3, ... (flattened leaves)
        return ltj.triton_call((x, (y, o)), (x.size, (alpha, True)), kernel=tk.nested_axpy, out_type=(y, o),
                               grid=grid_of(x.size), input_output_aliases={1: 0, 2: 1})

    f_add = jax.jit(add, static_argnums=2)
    f_refs = jax.jit(axpy_refs, static_argnums=2)
    f_alias = jax.jit(axpy_aliases, static_argnums=3)
    alpha = float(np.random.default_rng().uniform(-2.0, 2.0))
    for i in range(4):  # fresh data each time: the recorded graph replays with new contents
        hx, hy = fresh(N)
        x, y = jnp.asarray(hx), jnp.asarray(hy)
        check(f_add(x, y, 0.75), (hx.astype(np.float64) + hy * np.float64(0.75)).astype(np.float32), f"jax add {i}")
        out, y_after = f_refs(x, y, alpha)
        check(out, axpy_reference(hx, hy, alpha, True), f"jax refs {i}")
        check(y_after, hx, f"jax refs, written element {i}")
        y2, o2 = f_alias(x, y, jnp.full(x.shape, jnp.nan, x.dtype), alpha)
        check(o2, axpy_reference(hx, hy, alpha, True), f"jax aliases {i}")
        check(y2, hx, f"jax aliases, written element {i}")


# -- C++ ---------------------------------------------------------------------------------------

CPP_PROGRAM = r"""
#include <lazytriton/bundle.h>
#ifdef LT_LAZY
#include <lazytriton/embed.h>
#endif
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

// argv: bundle dir, kernels dir, n, alpha, data dir (x.bin, y.bin in; out.bin, y_after.bin, pair.bin out), mode.
std::vector<float> load(const std::string& f, int n) {
  std::vector<float> v(n);
  std::ifstream(f, std::ios::binary).read(reinterpret_cast<char*>(v.data()), n * 4);
  return v;
}
void save(const std::string& f, const std::vector<float>& v) {
  std::ofstream(f, std::ios::binary).write(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

int main(int argc, char** argv) {
  try {
    lt::Bundle b = lt::Bundle::open(argv[1]);
    int n = std::stoi(argv[3]);
    double alpha = std::stod(argv[4]);  // repr() of an fp32 value: read back exactly
    std::string dir = argv[5], mode = argv[6];
#ifdef LT_LAZY
    if (mode == "lazy") lt::enable_lazy(b, {{argv[2]}});
#endif
    const lt::Driver& d = lt::driver();
    lt::cu::CUcontext ctx = lt::current_context();
    (void)ctx;
    std::vector<float> hx = load(dir + "/x.bin", n), hy = load(dir + "/y.bin", n);
    lt::cu::CUdeviceptr x, y, out;
    for (auto* p : {&x, &y, &out}) lt::check(d.cuMemAlloc(p, size_t(n) * 4), "cuMemAlloc");
    lt::check(d.cuMemcpyHtoDAsync(x, hx.data(), size_t(n) * 4, nullptr), "cuMemcpyHtoDAsync");
    lt::check(d.cuMemcpyHtoDAsync(y, hy.data(), size_t(n) * 4, nullptr), "cuMemcpyHtoDAsync");
    lt::check(d.cuMemsetD8Async(out, 0xFF, size_t(n) * 4, nullptr), "cuMemsetD8Async");  // NaN
    auto grid = [n](const lt::Meta& m) { return lt::Dim3{unsigned((n + m["BLOCK"] - 1) / m["BLOCK"])}; };
    std::vector<float> hout(n), hy_after(n), hpair(n);
    if (mode == "lazy") {
      // add_pair is not in the bundle: tuned through Python on these buffers, then written into it.
      auto add = b.kernel("tuple_kernels:add_pair", "[*fp32,[*fp32,fp32]],*fp32,i32", {{"BLOCK", 256}});
      add.launch(nullptr, grid, {lt::DevicePtr(x), lt::DevicePtr(y), alpha, lt::DevicePtr(out), n});
      lt::check(d.cuMemcpyDtoHAsync(hpair.data(), out, size_t(n) * 4, nullptr), "cuMemcpyDtoHAsync");
      lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
      save(dir + "/pair.bin", hpair);
      lt::check(d.cuMemsetD8Async(out, 0xFF, size_t(n) * 4, nullptr), "cuMemsetD8Async");
    }
    auto axpy = b.kernel("tuple_kernels:nested_axpy", "[*fp32,[*fp32,*fp32]],[i32,[fp32,u1]]");
    axpy.launch(nullptr, grid, {lt::DevicePtr(x), lt::DevicePtr(y), lt::DevicePtr(out), n, alpha, true});
    lt::check(d.cuMemcpyDtoHAsync(hout.data(), out, size_t(n) * 4, nullptr), "cuMemcpyDtoHAsync");
    lt::check(d.cuMemcpyDtoHAsync(hy_after.data(), y, size_t(n) * 4, nullptr), "cuMemcpyDtoHAsync");
    lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    save(dir + "/out.bin", hout);
    save(dir + "/y_after.bin", hy_after);
    const lt::Winner& w = axpy.winner({lt::DevicePtr(x), lt::DevicePtr(y), lt::DevicePtr(out), n, alpha, true});
    std::printf("winner: %s\n", w.specialization.c_str());
#ifdef LT_LAZY
    std::printf("python resolutions: %llu\n", (unsigned long long)lt::lazy_stats().resolutions);
#endif
  } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what());
    return 2;
  }
}
"""

CPP_CMAKE = """
cmake_minimum_required(VERSION 3.18)
project(tuples LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
find_package(lazytriton CONFIG REQUIRED)
add_executable(tuples tuples.cc)
if(TARGET lazytriton::embed)
  target_link_libraries(tuples PRIVATE lazytriton::embed)
  target_compile_definitions(tuples PRIVATE LT_LAZY=1)
else()
  target_link_libraries(tuples PRIVATE lazytriton::runtime)
endif()
"""


@pytest.mark.parametrize("mode", ["aot", "lazy"])
def test_cpp_bundle_launches_tuple_kernels(tmp_path, cache_dir, mode):
    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    src = tmp_path / "src"
    src.mkdir()
    (src / "tuples.cc").write_text(CPP_PROGRAM)
    (src / "CMakeLists.txt").write_text(CPP_CMAKE)
    cmake_build(src, tmp_path / "build")
    # An fp32 value: the C++ program passes exactly this double, the key the winner was tuned for.
    alpha = float(np.float32(np.random.default_rng().uniform(-2.0, 2.0)))
    # Tune nested_axpy from Python on CuPy arrays (the key names the tuple: n, alpha and the flag)
    # and write its winner, as a deployment would.
    d = tmp_path / "bundle"
    hx, hy = fresh(N)
    x, y, out = cp.asarray(hx), cp.asarray(hy), cp.full(N, cp.nan, dtype=cp.float32)
    v = bundle.Bundle(d).add(tk.nested_axpy, (x, (y, out)), (N, (alpha, True)), grid=grid_of(N),
                             source="tuple_kernels:nested_axpy")
    assert v["layout"] == ["[_,[_,_]]", "[_,[_,_]]"] and v["key_values"]["dims[1][1]"] is True
    check(y.get(), hy, "Bundle.add resolves without launching: the caller's y is untouched")
    hx, hy = fresh(N)  # the C++ run gets its own fresh data
    data = tmp_path / "data"
    data.mkdir()
    hx.tofile(data / "x.bin")
    hy.tofile(data / "y.bin")
    kernels_dir = str(tk.__file__).rsplit("/", 1)[0]
    outp = run(tmp_path / "build" / "tuples", d, kernels_dir, N, repr(alpha), data, mode)
    if mode == "lazy" and "python resolutions" not in outp.stdout and outp.returncode == 0:
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    assert outp.returncode == 0, outp.stdout + outp.stderr[-4000:]
    a32 = np.float32(alpha)
    check(np.fromfile(data / "out.bin", np.float32), axpy_reference(hx, hy, alpha, True), f"C++ {mode} axpy")
    check(np.fromfile(data / "y_after.bin", np.float32), hx, f"C++ {mode}: the written tuple element")
    assert "winner: sm_" in outp.stdout and "dims[1][1]=1" in outp.stdout, outp.stdout
    if mode == "lazy":
        check(np.fromfile(data / "pair.bin", np.float32),
              (hx.astype(np.float64) + hy.astype(np.float64) * np.float64(a32)).astype(np.float32), "C++ lazy add_pair")
        assert "python resolutions: 1" in outp.stdout, outp.stdout
        (pair,) = bundle.Bundle(d).variants("add_pair")
        assert pair["layout"] == ["[_,[_,_]]", "", "", ""] and pair["signature"].startswith("[*fp32:16,[*fp32:16,fp32]]")
