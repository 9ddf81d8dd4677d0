"""lazytriton.jax.triton_call on a GPU, with command buffers forced on for
every custom call (conftest.py sets XLA_FLAGS before JAX starts)."""
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import triton  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import jax as ltj  # noqa: E402
from kernels import jaxk  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("jax_gpu")]
TESTS = Path(__file__).resolve().parent


def cdiv_grid(n):
    return lambda m: (triton.cdiv(n, m["BLOCK"]),)


def add(x, y, block=256):
    n = x.size
    return ltj.triton_call(x, y, n, kernel=jaxk.add_kernel, out_type=x, grid=cdiv_grid(n), BLOCK=block)


def test_add_resolves_once_then_replays_without_the_handler(cache_dir):
    f = jax.jit(add)
    x = jnp.arange(5000, dtype=jnp.float32)
    y = jnp.ones(5000, jnp.float32)
    np.testing.assert_array_equal(f(x, y), np.arange(5000) + 1.0)
    resolves = lazytriton.stats()["resolves"]
    executes = ltj.handler_stats()["executes"]
    for _ in range(30):
        out = f(x, y)
    np.testing.assert_array_equal(out, np.arange(5000) + 1.0)
    # Replays of the recorded command buffer run no handler (and no Python);
    # XLA re-records (runs the handler under capture) when addresses change.
    assert ltj.handler_stats()["executes"] - executes < 10
    assert lazytriton.stats()["resolves"] == resolves


def test_autotuned_matmul_matches_reference(cache_dir):
    m, n, k = 512, 384, 256

    def mm(a, b):
        return ltj.triton_call(a, b, m, n, k, k, 1, n, 1, n, 1, kernel=jaxk.matmul_kernel,
                               out_type=jax.ShapeDtypeStruct((m, n), jnp.float16),
                               grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])))

    ka, kb = jax.random.split(jax.random.key(0))
    a = jax.random.normal(ka, (m, k), jnp.float16)
    b = jax.random.normal(kb, (k, n), jnp.float16)
    out = jax.jit(mm)(a, b)
    ref = jnp.dot(a.astype(jnp.float32), b.astype(jnp.float32))
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, rtol=2e-2, atol=5e-2)
    assert lazytriton.stats()["tunes"] >= 1


@pytest.mark.parametrize("donate", [False, True])
def test_in_place_alias_is_x_plus_one_after_tuning(cache_dir, donate):
    n = 100_003

    def inc(x):
        return ltj.triton_call(x, n, kernel=jaxk.inc_inplace_kernel, out_type=x, grid=cdiv_grid(n),
                               input_output_aliases={0: 0})

    f = jax.jit(inc, donate_argnums=(0,) if donate else ())
    x = jnp.arange(n, dtype=jnp.float32)
    out = f(x)
    np.testing.assert_array_equal(out, np.arange(n) + 1.0)  # never x + k: trials were undone
    out2 = f(out)
    np.testing.assert_array_equal(out2, np.arange(n) + 2.0)


def test_declared_alias_that_xla_did_not_share_starts_as_a_copy(cache_dir, monkeypatch):
    # XLA normally honours a declared alias (copying the input first when it
    # must); upstream crashed when it did not. Lowering the same call without
    # XLA's aliasing makes the output a separate buffer the handler must
    # initialize from the input before the kernel writes half of it.
    real = jax.ffi.ffi_lowering

    def no_xla_aliasing(*args, operand_output_aliases=None, **kw):
        assert operand_output_aliases == {0: 0}
        return real(*args, **kw)

    monkeypatch.setattr(jax.ffi, "ffi_lowering", no_xla_aliasing)
    n = 10_001

    def inc_even(x):
        return ltj.triton_call(x, n, kernel=jaxk.inc_even_kernel, out_type=x, grid=cdiv_grid(n),
                               input_output_aliases={0: 0})

    x = jax.random.normal(jax.random.key(3), (n,), jnp.float32)
    orig = np.asarray(x).copy()
    want = orig.copy()
    want[::2] += 1
    copies = ltj.handler_stats()["alias_copies"]
    f = jax.jit(inc_even)
    for _ in range(3):  # tuned, then launched (or replayed)
        np.testing.assert_array_equal(f(x), want)
    assert ltj.handler_stats()["alias_copies"] > copies
    np.testing.assert_array_equal(x, orig)  # the input itself is untouched


def test_two_outputs_one_aliased(cache_dir):
    n = 4096

    def sd(x, y):
        return ltj.triton_call(x, y, n, kernel=jaxk.sum_diff_inplace_kernel, out_type=(x, x), grid=cdiv_grid(n),
                               input_output_aliases={0: 0})

    x = jnp.arange(n, dtype=jnp.float32)
    y = jnp.full(n, 3.0, jnp.float32)
    s, d = jax.jit(sd)(x, y)
    np.testing.assert_array_equal(s, np.arange(n) + 3.0)
    np.testing.assert_array_equal(d, np.arange(n) - 3.0)


def test_zeroed_output_is_zeroed_before_every_launch(cache_dir):
    n = 50_000

    def total(x):
        return ltj.triton_call(x, n, kernel=jaxk.total_kernel, out_type=jax.ShapeDtypeStruct((1,), jnp.float32),
                               grid=cdiv_grid(n), zeroed_outputs=(0,))

    f = jax.jit(total)
    x = jnp.ones(n, jnp.float32)
    for _ in range(5):  # tuning trials and every replay start from zero
        assert float(f(x)[0]) == n


def test_scalars_autotune_and_heuristics(cache_dir):
    n = 4096

    def axpb(x, flag):
        return ltj.triton_call(x, 2.5, 1, flag, n, kernel=jaxk.axpb_kernel, out_type=x, grid=cdiv_grid(n))

    x = jnp.arange(n, dtype=jnp.float32)
    np.testing.assert_allclose(jax.jit(axpb, static_argnums=1)(x, False), np.arange(n) * 2.5 + 1)
    np.testing.assert_allclose(jax.jit(axpb, static_argnums=1)(x, True), -(np.arange(n) * 2.5 + 1))


def test_pytree_outputs_and_custom_vjp(cache_dir):
    n = 1000

    def two(x, y):
        # Outputs follow the flattened pytree order: s, then d.
        shapes = {"s": x, "t": [jax.ShapeDtypeStruct(x.shape, x.dtype)]}
        return ltj.triton_call(x, y, n, kernel=jaxk.sum_diff_kernel, out_type=shapes, grid=cdiv_grid(n))

    x = jnp.arange(n, dtype=jnp.float32)
    y = jnp.ones(n, jnp.float32)
    out = jax.jit(two)(x, y)
    np.testing.assert_array_equal(out["s"], np.arange(n) + 1.0)
    np.testing.assert_array_equal(out["t"][0], np.arange(n) - 1.0)

    @jax.custom_vjp
    def plus(x, y):
        return add(x, y)

    plus.defvjp(lambda x, y: (add(x, y), None), lambda _, g: (g, g))
    gx = jax.jit(jax.grad(lambda x: plus(x, y).sum()))(x)
    np.testing.assert_array_equal(gx, np.ones(n))
    with pytest.raises(NotImplementedError, match="add_kernel cannot be differentiated"):
        jax.grad(lambda x: add(x, y).sum())(x)


def test_vmap_runs_sequentially(cache_dir):
    x = jnp.arange(3 * 700, dtype=jnp.float32).reshape(3, 700)
    y = jnp.ones((3, 700), jnp.float32)
    out = jax.jit(jax.vmap(add))(x, y)
    np.testing.assert_array_equal(out, np.asarray(x) + 1)


def test_chain_of_32_kernels_captured_and_correct(cache_dir):
    n = 2048

    def chain(x):
        for _ in range(32):
            x = ltj.triton_call(x, n, kernel=jaxk.add_one_kernel, out_type=x, grid=cdiv_grid(n), BLOCK=1024)
        return x

    f = jax.jit(chain)
    x = f(jnp.zeros(n, jnp.float32))
    executes = ltj.handler_stats()["executes"]
    for i in range(50):
        x = f(x)
    np.testing.assert_array_equal(x, np.full(n, 32.0 * 51))
    # A few re-records (new buffer addresses) at most, never the handler per replay.
    assert ltj.handler_stats()["executes"] - executes < 50 * 32 / 4


SCATTER = """
import os, sys
import jax, jax.numpy as jnp, numpy as np, triton
sys.path.insert(0, {tests!r})
from lazytriton import jax as ltj
from kernels import jaxk
n = 1 << 16

@jax.jit
def permute(src, key):
    idx = jnp.argsort(jax.random.uniform(key, (n,))).astype(jnp.int32)  # produced in this jit
    dst = ltj.triton_call(src, idx, n, kernel=jaxk.scatter_kernel, out_type=src,
                          grid=lambda m: (triton.cdiv(n, m["BLOCK"]),))
    return dst, idx

src = jnp.arange(n, dtype=jnp.float32)
for i in range(3):
    dst, idx = permute(src, jax.random.key(i))
    expect = np.empty(n, np.float32)
    expect[np.asarray(idx)] = np.arange(n)
    np.testing.assert_array_equal(np.asarray(dst), expect)
print("SCATTER OK")
"""


def _run_script(code: str, env_extra: dict, timeout: int = 300, prefix=()) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra}
    # Outside the source tree, so that the installed package is imported.
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=os.path.expanduser("~"))


def test_index_driven_scatter_is_correct(cache_dir):
    r = _run_script(SCATTER.format(tests=str(TESTS)), {})
    assert "SCATTER OK" in r.stdout, r.stderr[-3000:]


def test_index_driven_scatter_is_clean_under_compute_sanitizer(cache_dir):
    sanitizer = "compute-sanitizer"
    if subprocess.run(["which", sanitizer], capture_output=True).returncode != 0:
        pytest.skip("compute-sanitizer not installed")
    r = _run_script(SCATTER.format(tests=str(TESTS)), {"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, timeout=600,
                    prefix=(sanitizer, "--tool", "memcheck", "--error-exitcode", "99"))
    assert "SCATTER OK" in r.stdout, (r.stdout[-3000:], r.stderr[-3000:])
    out = r.stdout + r.stderr
    # The report's headlines (what was hit, and where), not its host backtraces.
    said = [ln for ln in out.splitlines() if ln.startswith("=========") and "Host Frame" not in ln and ln.strip("= ")]
    assert r.returncode == 0 and "ERROR SUMMARY: 0 errors" in out, "\n".join(said[:40])


PERSIST = """
import sys, json
import jax, jax.numpy as jnp, numpy as np, triton
sys.path.insert(0, {tests!r})
hits = []
jax.monitoring.register_event_listener(lambda name, **kw: hits.append(name))
jax.config.update("jax_compilation_cache_dir", {jcache!r})
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
import lazytriton
from lazytriton import jax as ltj
from kernels import jaxk
n = 3000
f = jax.jit(lambda x: ltj.triton_call(x, 2.0, 3, False, n, kernel=jaxk.axpb_kernel, out_type=x,
                                     grid=lambda m: (triton.cdiv(n, m["BLOCK"]),)))
x = jnp.arange(n, dtype=jnp.float32)
out = f(x)
np.testing.assert_array_equal(np.asarray(out), np.arange(n) * 2.0 + 3)
print(json.dumps({{"stats": lazytriton.stats(), "cache_hit": "/jax/compilation_cache/cache_hits" in hits}}))
"""


def test_fresh_process_from_jax_persistent_cache(cache_dir, tmp_path):
    import json

    code = PERSIST.format(tests=str(TESTS), jcache=str(tmp_path / "jaxcache"))
    first = _run_script(code, {"LAZYTRITON_CACHE_DIR": str(cache_dir)})
    assert first.returncode == 0, first.stderr[-3000:]
    a = json.loads(first.stdout.strip().splitlines()[-1])
    assert a["stats"]["tunes"] == 1 and not a["cache_hit"]
    second = _run_script(code, {"LAZYTRITON_CACHE_DIR": str(cache_dir)})
    assert second.returncode == 0, second.stderr[-3000:]
    b = json.loads(second.stdout.strip().splitlines()[-1])
    assert b["cache_hit"], "JAX did not load the executable from its persistent cache"
    assert b["stats"]["compiles"] == 0 and b["stats"]["tunes"] == 0 and b["stats"]["record_hits"] == 1
    assert b["stats"]["bench_launches"] == 0


def test_first_calls_from_many_threads(cache_dir):
    n = 70_001

    def inc(x):
        return ltj.triton_call(x, n, kernel=jaxk.inc_inplace_kernel, out_type=x, grid=cdiv_grid(n),
                               input_output_aliases={0: 0})

    f = jax.jit(inc)
    x = jnp.arange(n, dtype=jnp.float32)
    results, errors = [None] * 8, []

    def work(i):
        try:
            results[i] = np.asarray(f(x))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert not errors, errors
    for r in results:
        np.testing.assert_array_equal(r, np.arange(n) + 1.0)


def test_compile_error_surfaces_as_an_xla_error_naming_the_kernel(cache_dir):
    n = 128
    f = jax.jit(lambda x: ltj.triton_call(x, n, kernel=jaxk.bad_kernel, out_type=x, grid=(1,), BLOCK=128))
    with pytest.raises(Exception, match="bad_kernel"):
        f(jnp.zeros(n, jnp.float32)).block_until_ready()


def test_unresolved_kernel_never_tunes_under_capture(cache_dir):
    """What the handler does when XLA captures a site that never ran (older
    jax): the resolver is told the stream is capturing and refuses to tune."""
    cupy = pytest.importorskip("cupy")
    from lazytriton.model.arrays import DeviceArray
    from lazytriton.runtime.kernel import LazyKernel
    from lazytriton.runtime.resolve import CaptureError

    n = 4096
    x = cupy.arange(n, dtype=cupy.float32)
    k = LazyKernel(jaxk.inc_inplace_kernel)
    s = cupy.cuda.Stream(non_blocking=True)
    bench_before = lazytriton.stats()["bench_launches"]
    arr = DeviceArray(x.data.ptr, "fp32", x.nbytes)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(CaptureError, match="never compiles or tunes under capture"):
                k.resolve(arr, n, grid=cdiv_grid(n), stream=s.ptr, mode="record")
        finally:
            s.end_capture()
    assert lazytriton.stats()["bench_launches"] == bench_before
    np.testing.assert_array_equal(cupy.asnumpy(x), np.arange(n))


def test_shard_map_on_two_gpus(cache_dir):
    if len(jax.devices()) < 2:
        pytest.skip("needs two GPUs")
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("d",))
    per = 8192

    def local(x, y):
        return add(x, y, block=1024)

    f = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d")))
    x = jax.device_put(jnp.arange(2 * per, dtype=jnp.float32), NamedSharding(mesh, P("d")))
    y = jax.device_put(jnp.ones(2 * per, jnp.float32), NamedSharding(mesh, P("d")))
    before = lazytriton.stats()["tunes"] + lazytriton.stats()["record_hits"]
    for _ in range(3):
        out = f(x, y)
    np.testing.assert_array_equal(out, np.arange(2 * per) + 1.0)
    # Both devices are the same model: one resolution serves both.
    assert lazytriton.stats()["tunes"] + lazytriton.stats()["record_hits"] - before <= 1


def test_transformer_engine_permute_with_keyword_cols_is_correct_on_every_execution(cache_dir):
    """Issue 15's reproduction: an autotuned, index-driven row permutation with
    `cols` passed as a keyword that the autotune key names, command buffers
    on, new keys on every call. The tuning launch and the C++ launches used
    to disagree about `cols` (wrong results, then CUDA_ERROR_INVALID_VALUE
    while XLA recorded the command buffer)."""
    from kernels import capture

    rows, cols = 4096, 1024

    @jax.jit
    def step(keys, inp, y):
        dst = jnp.argsort(jnp.argsort(keys)).astype(jnp.int32)
        out = ltj.triton_call(inp, dst, kernel=capture.permute_rows, out_type=inp, grid=(rows,), cols=cols)
        return out, y * 2.0

    inp = jax.random.normal(jax.random.key(1), (rows, cols), jnp.float32)
    y = jnp.arange(rows, dtype=jnp.float32)
    for i in range(4):
        keys = jax.random.uniform(jax.random.key(10 + i), (rows,))
        out, y2 = step(keys, inp, y)
        dst = np.argsort(np.argsort(np.asarray(keys), kind="stable"), kind="stable")
        want = np.empty((rows, cols), np.float32)
        want[dst] = np.asarray(inp)
        np.testing.assert_array_equal(np.asarray(out), want)
        np.testing.assert_array_equal(np.asarray(y2), np.arange(rows) * 2.0)
