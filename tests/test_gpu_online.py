"""Online tuning on a GPU (torch tensors; the JAX face through jax.jit): every call's result is one
complete launch of one correct candidate on the caller's data, from the first call to well after the
winner is fixed; in-place kernels and reset_to_zero need nothing saved; a restart continues. Skipped
without a GPU."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import triton

import lazytriton
from lazytriton.runtime import online

from kernels import basic

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU", allow_module_level=True)

TESTS = Path(__file__).resolve().parent
SAMPLES = 3


def kernel(fn):
    return lazytriton.kernel(fn, tuning="online", tune_options=lazytriton.TuneOptions(online_samples=SAMPLES))


LIMIT_S = 120  # the calls made while candidates still compile launch the best so far: as many as come


def until_settled(k, call, after: int = 3) -> int:
    """Calls `call(i)` until k's session settled, then `after` more; the number of calls it took."""
    start, i = time.monotonic(), 0
    while time.monotonic() - start < LIMIT_S:
        call(i)
        i += 1
        if not k._online:
            for j in range(after):
                call(i + j)
            return i
    pytest.fail(f"kernel {k.name}: not settled after {LIMIT_S} s, {i} calls ({online.counters()})")


def test_every_matmul_call_equals_the_reference_on_fresh_poisoned_data(cache_dir):
    k = kernel(basic.matmul_kernel)
    M, N, K = 512, 384, 256
    grid = lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))  # noqa: E731
    before = online.counters()

    def call(i):
        a = torch.randn(M, K, device="cuda", dtype=torch.float16)
        b = torch.randn(K, N, device="cuda", dtype=torch.float16)
        c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
        k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)
        torch.testing.assert_close(c.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2, msg=f"call {i}")
        return a, b, c

    until_settled(k, call)
    timed = online.counters()["timed_launches"] - before["timed_launches"]
    assert timed == SAMPLES * 8, timed  # every candidate timed SAMPLES times, no more
    a, b, c = call(-1)
    rec = k.records[-1]
    assert rec.extra.get("online") and sum(c["time_ms"] is not None for c in rec.candidates) >= 2
    before = lazytriton.stats()["resolves"]
    k[grid](a, b, c, M, N, K, K, 1, N, 1, N, 1)  # the winner, from C++
    assert lazytriton.stats()["resolves"] == before


def test_in_place_each_call_adds_exactly_one(cache_dir):
    k = kernel(basic.increment_kernel)
    n = 100_003

    def call(i):
        x0 = torch.randn(n, device="cuda")
        x = x0.clone()
        k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
        torch.testing.assert_close(x, x0 + 1, rtol=0, atol=0, msg=f"call {i}")  # one launch: no trial ran on x

    until_settled(k, call)
    assert k.records[-1].extra.get("online")


def test_reset_to_zero_kernel_sums_once_per_call(cache_dir):
    k = kernel(basic.sum_kernel)
    n = 65_536

    def call(i):
        x = torch.rand(n, device="cuda")
        total = torch.zeros(1, device="cuda")  # zeroed by the caller, as Triton's users do
        k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, total, n)
        torch.testing.assert_close(total, x.sum().reshape(1), rtol=1e-4, atol=1e-2, msg=f"call {i}")

    until_settled(k, call)


def test_calls_on_a_side_stream_without_a_synchronize_are_each_one_launch(cache_dir):
    k = kernel(basic.increment_kernel)
    n = 1 << 20
    s = torch.cuda.Stream()
    x = torch.zeros(n, device="cuda")
    with torch.cuda.stream(s):  # no host synchronize between calls: events read as the GPU passes them
        calls = until_settled(k, lambda i: k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n), after=5)
    s.synchronize()
    assert torch.equal(x, torch.full_like(x, calls + 5))


RESTART = r"""
import json, sys, time
sys.path.insert(0, {tests!r})
import torch, triton, lazytriton
from lazytriton.runtime import online
from kernels import basic
k = lazytriton.kernel(basic.increment_kernel, tuning="online", tune_options=lazytriton.TuneOptions(online_samples=3))
n = 1 << 16
x = torch.zeros(n, device="cuda")
calls = 0
while calls < {calls} or ({settle} and k._online and calls < 5000):
    k[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, n)
    torch.cuda.synchronize()  # each call's events passed before the next: it reads them
    calls += 1
    while calls == 1 and any(s.compiling for s in k._online.values()):
        time.sleep(0.01)  # every candidate compiled: the calls that follow are timed ones
torch.cuda.synchronize()
print(json.dumps({{"ok": bool(torch.equal(x, torch.full_like(x, calls))), "history": online.history(),
                  "counters": online.counters(), "hits": lazytriton.stats()["record_hits"]}}))
"""


def test_a_restart_continues_from_the_samples_persisted(tmp_path):
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / "cache")}

    def run(calls, settle=False):
        r = subprocess.run([sys.executable, "-c", RESTART.format(tests=str(TESTS), calls=calls, settle=settle)],
                           env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-4000:]
        return json.loads(r.stdout.strip().splitlines()[-1])

    first = run(9)  # the first call and 8 timed launches of 6 candidates (7 read): not settled
    assert first["ok"] and first["counters"]["settled"] == 0 and first["counters"]["timed_launches"] == 8
    second = run(2, settle=True)
    assert second["ok"] and second["counters"]["settled"] == 1
    # 11 more timed launches, not a fresh session's 18: the 7 samples read before were kept.
    assert second["counters"]["timed_launches"] == 3 * 6 - 7, second
    third = run(2)
    assert third["ok"] and third["hits"] == 1 and third["counters"]["sessions"] == 0


JAX = r"""
import json, os, sys
sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, numpy as np, triton
from lazytriton import jax as ltj
from lazytriton.runtime import online
from kernels import jaxk
n = 100_000
f = jax.jit(lambda x, y: ltj.triton_call(x, y, n, kernel=jaxk.add_kernel, out_type=x,
                                         grid=lambda m: (triton.cdiv(n, m["BLOCK"]),), BLOCK=1024))
rng = np.random.default_rng(0)
ok = []
for i in range(3):
    x, y = (jnp.asarray(rng.standard_normal(n), jnp.float32) for _ in range(2))
    ok.append(bool(jnp.array_equal(f(x, y), x + y)))
m, k = 256, 128
g = jax.jit(lambda a, b: ltj.triton_call(a, b, m, m, k, k, 1, m, 1, m, 1, kernel=jaxk.matmul_kernel,
                                         out_type=jax.ShapeDtypeStruct((m, m), jnp.float32),
                                         grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(m, meta["BN"]))))
i = 0
while i < {calls} or ({settle} and online.counters()["settled"] == 0 and i < 5000):
    a = jnp.asarray(rng.standard_normal((m, k)), jnp.float16)
    b = jnp.asarray(rng.standard_normal((k, m)), jnp.float16)
    ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32), precision=jax.lax.Precision.HIGHEST)
    ok.append(bool(jnp.allclose(g(a, b), ref, rtol=2e-2, atol=2e-1)))
    i += 1
print(json.dumps({{"ok": ok, "executions": i, "counters": online.counters()}}))
"""


def run_jax(tmp_path, calls, xla_flags, settle=False):
    pytest.importorskip("jax")
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / "cache"), "LAZYTRITON_TUNING": "online",
           "XLA_FLAGS": xla_flags, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    r = subprocess.run([sys.executable, "-c", JAX.format(tests=str(TESTS), calls=calls, settle=settle)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_jax_without_command_buffers_every_execution_tunes_until_the_winner(tmp_path):
    out = run_jax(tmp_path, 5, "--xla_gpu_enable_command_buffer=", settle=True)
    assert all(out["ok"]), out
    # The matmul (8 configs, 5 samples each) settles; the untuned add is no session.
    assert out["counters"]["sessions"] == 1 and out["counters"]["settled"] == 1, out
    assert out["counters"]["timed_launches"] == 8 * 5, out


def test_jax_with_command_buffers_the_captured_candidate_is_replayed_correct(tmp_path):
    """XLA runs the handler eagerly once, then records it into a graph it replays without the
    handler: the graph keeps the candidate of its capture (the best so far: the first ready), and
    online tuning does not go on while it replays. Every result is still correct."""
    out = run_jax(tmp_path, 12, "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1")
    assert all(out["ok"]), out
    # The eager execution's first-ready candidate, then the capture's (untimed): replays add none.
    assert out["counters"]["sessions"] == 1 and out["counters"]["untimed_launches"] >= 2, out
    print("command buffers on, 12 executions:", out["counters"])


# -- C++ lazy mode: each call's candidate from the embedded Python, launched and timed by C++ ----------

CPP = r"""
#include <lazytriton/embed.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

// argv: bundle, kernels' directory, the most calls. Each call: fresh random data, the output
// poisoned (NaN), out = x * 2.5, checked exactly; it stops 3 calls after Python's last resolution.
int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  lt::enable_lazy(b, {{argv[2]}});
  auto scale = b.kernel("example_kernels:scale_kernel", "*fp32,*fp32,fp32,i32");
  const lt::Driver& d = lt::driver();
  lt::current_context();
  const int n = 1 << 20;
  const size_t bytes = size_t(n) * 4;
  lt::cu::CUdeviceptr x, out;
  lt::check(d.cuMemAlloc(&x, bytes), "cuMemAlloc");
  lt::check(d.cuMemAlloc(&out, bytes), "cuMemAlloc");
  std::vector<float> hx(n), hout(n);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  auto grid = [&](const lt::Meta& m) { return lt::Dim3{unsigned((n + m["BLOCK"] - 1) / m["BLOCK"])}; };
  int wrong = 0, calls = 0, stable = 0;
  unsigned long long last = 0;
  auto start = std::chrono::steady_clock::now();
  for (int most = std::atoi(argv[3]); calls < most && stable < 3; ++calls) {
    for (float& v : hx) v = normal(rng);
    lt::check(d.cuMemcpyHtoDAsync(x, hx.data(), bytes, nullptr), "cuMemcpyHtoDAsync");
    lt::check(d.cuMemsetD32Async(out, 0x7fc00001u, n, nullptr), "cuMemsetD32Async");  // NaN
    scale.launch(nullptr, grid, {lt::DevicePtr(x), lt::DevicePtr(out), 2.5f, n});
    lt::check(d.cuMemcpyDtoHAsync(hout.data(), out, bytes, nullptr), "cuMemcpyDtoHAsync");
    lt::check(d.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
    for (int i = 0; i < n; ++i) wrong += hout[i] != hx[i] * 2.5f;
    unsigned long long r = lt::lazy_stats().resolutions;
    stable = r == last ? stable + 1 : 0;
    last = r;
    if (std::chrono::steady_clock::now() - start > std::chrono::seconds(120)) break;
  }
  const lt::Winner& w = scale.winner({lt::DevicePtr(x), lt::DevicePtr(out), 2.5f, n});
  std::printf("calls %d wrong %d resolutions %llu python %d BLOCK %lld warps %d\n", calls, wrong, last,
              int(lt::lazy_stats().python_started), (long long)w.meta["BLOCK"], w.kernel->meta().num_warps);
  return 0;
}
"""


def test_cpp_lazy_mode_tunes_online_every_call_correct_then_the_bundle_needs_no_python(tmp_path, cache_dir):
    from test_embed import CMAKE, EXAMPLE, cmake_build, cmake_project

    from lazytriton import paths
    from lazytriton.cpp import bundle

    if CMAKE is None:
        pytest.skip("needs cmake")
    if not list(Path(paths.cmake_dir()).parent.parent.glob("liblazytriton_embed*")):
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    src = tmp_path / "src"
    src.mkdir()
    (src / "online.cc").write_text(CPP)
    (src / "CMakeLists.txt").write_text(cmake_project("online", "online.cc").replace("lazytriton::runtime",
                                                                                    "lazytriton::embed"))
    cmake_build(src, src / "build")
    env = {**os.environ, "LAZYTRITON_TUNING": "online"}

    def run(most):
        r = subprocess.run([str(src / "build" / "online"), str(tmp_path / "bundle"), str(EXAMPLE), str(most)],
                           env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
        words = r.stdout.split()
        return dict(zip(words[::2], map(int, words[1::2])))

    first = run(100_000)
    # Settled: 4 configs x 5 samples, a first call and a deciding call at least, each one Python
    # resolution; then 3 calls with none (C++ alone); every result exact.
    assert first["wrong"] == 0 and first["resolutions"] >= 22 and first["calls"] == first["resolutions"] + 3, first
    (variant,) = bundle.Bundle(tmp_path / "bundle").variants()
    assert variant["meta"]["BLOCK"] == first["BLOCK"] and variant["launch"]["num_warps"] == first["warps"]
    second = run(5)
    assert second["wrong"] == 0 and second["python"] == 0 and second["resolutions"] == 0, second
    assert (second["BLOCK"], second["warps"]) == (first["BLOCK"], first["warps"])
