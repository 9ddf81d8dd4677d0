"""Issue 46: calls made the way PyTorch users make them, with no stream=: the launch goes to
torch's current stream (side streams, torch.cuda.graph, torch.compile's CUDA graphs), as
Triton's does; a cold first call under capture is refused before it could spoil the capture;
a persisted winner is captured on a new process's very first call; option-named parameters
(num_warps: tl.constexpr) are bound as Triton binds them. Each compares with a reference on
fresh random data, outputs poisoned with NaN first (tests/test_gpu_memcheck.py re-runs this
file under compute-sanitizer)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs torch with CUDA", allow_module_level=True)

import triton  # noqa: E402

import lazytriton  # noqa: E402
from kernels import differential_kernels as dk, streams  # noqa: E402

N = 1 << 20


def grid(meta):
    return (triton.cdiv(N, meta["BLOCK"]),)


def poisoned(n=N):
    return torch.full((n,), float("nan"), device="cuda")


def slow_producer(x, src):
    """On the current stream: a long sleep, then x = src (a kernel reading x too early sees NaN)."""
    torch.cuda._sleep(100_000_000)
    x.copy_(src)


@pytest.mark.parametrize("first", ["cold", "warm"])
def test_side_stream_with_a_slow_producer(cache_dir, first):
    k = lazytriton.kernel(streams.scale_add)
    if first == "warm":
        k[grid](torch.randn(N, device="cuda"), poisoned(), N)  # resolved on the default stream
    torch.cuda.synchronize()
    s = torch.cuda.Stream()  # a pool stream: non-blocking, no implicit order with stream 0
    for _ in range(3):
        x, out, src = poisoned(), poisoned(), torch.randn(N, device="cuda")
        torch.cuda.synchronize()
        with torch.cuda.stream(s):
            slow_producer(x, src)
            k[grid](x, out, N)  # a cold first call tunes on s too, after the producer
            after = out * 1.0  # a consumer on s
            assert lazytriton._core.default_stream((x, out, N)) == s.cuda_stream  # the rule k[grid] read
        torch.cuda.synchronize()
        assert torch.equal(after, src * 2 + 1)


def test_graph_capture_after_warm_up(cache_dir):
    k = lazytriton.kernel(streams.scale_add)
    x, out = torch.randn(N, device="cuda"), poisoned()
    s = torch.cuda.Stream()  # PyTorch's documented warm-up on a side stream
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        k[grid](x, out, N)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    launches = lazytriton.stats()["launches"]
    with torch.cuda.graph(g):
        k[grid](x, out, N)
    assert lazytriton.stats()["launches"] == launches + 1
    for _ in range(3):
        src = torch.randn(N, device="cuda")
        x.copy_(src)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, src * 2 + 1)


def test_reduce_overhead_through_a_custom_op(cache_dir):
    k = lazytriton.kernel(streams.scale_add)
    name = f"lt_test::scale_add_{os.getpid()}"

    @torch.library.custom_op(name, mutates_args=())
    def scale_add(x: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(x, float("nan"))
        k[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](x, out, x.numel())
        return out

    @scale_add.register_fake
    def _(x):
        return torch.empty_like(x)

    f = torch.compile(lambda x: scale_add(x) * 3.0, mode="reduce-overhead")
    for _ in range(6):  # cudagraph trees: warm-up runs, then recording, then replays
        src = torch.randn(N, device="cuda")
        got = f(src).clone()
        torch.cuda.synchronize()
        assert torch.equal(got, (src * 2 + 1) * 3.0)


def test_a_cold_first_call_under_capture_is_refused_and_the_capture_survives(cache_dir):
    k = lazytriton.kernel(streams.scale_add)
    x, out, y = torch.randn(N, device="cuda"), poisoned(), poisoned()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    compiles = lazytriton.stats()["compiles"]
    with torch.cuda.graph(g):
        y.copy_(x * 5.0)
        with pytest.raises(lazytriton.CaptureError, match=r"kernel scale_add: .*captured.*Call the kernel once"):
            k[grid](x, out, N)
        y.add_(1.0)
    assert lazytriton.stats()["compiles"] == compiles  # nothing compiled or tuned under capture
    src = torch.randn(N, device="cuda")
    x.copy_(src)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, src * 5.0 + 1.0)
    assert torch.isnan(out).all()  # the refused launch is in no graph
    k[grid](x, out, N)  # after the capture: compiles, tunes and launches as usual
    torch.cuda.synchronize()
    assert torch.equal(out, src * 2 + 1)


CHILD = textwrap.dedent("""
    import json, sys
    import torch, triton, lazytriton
    sys.path.insert(0, sys.argv[1])
    from kernels import streams
    N = 1 << 20
    grid = lambda m: (triton.cdiv(N, m["BLOCK"]),)
    k = lazytriton.kernel(streams.scale_add)
    x, out = torch.randn(N, device="cuda"), torch.full((N,), float("nan"), device="cuda")
    if sys.argv[2] == "tune":
        k[grid](x, out, N)
    else:  # the very first call of this process, under capture: the persisted winner, loaded and captured
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            k[grid](x, out, N)
        for _ in range(3):
            src = torch.randn(N, device="cuda")
            x.copy_(src)
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, src * 2 + 1)
    torch.cuda.synchronize()
    print(json.dumps(lazytriton.stats()))
""")


def test_a_new_process_captures_its_persisted_winner_on_its_first_call(tmp_path):
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_CACHE_DIR=str(tmp_path / "tc"))
    tests = os.path.dirname(os.path.abspath(__file__))
    stats = []
    for step in ("tune", "capture"):
        # cwd outside the checkout: the child imports the installed package.
        r = subprocess.run([sys.executable, "-c", CHILD, tests, step], env=env, capture_output=True, text=True,
                           timeout=300, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-3000:]
        stats.append(json.loads(r.stdout.strip().splitlines()[-1]))
    assert stats[0]["compiles"] > 0
    assert stats[1]["compiles"] == 0 and stats[1]["bench_launches"] == 0 and stats[1]["record_hits"] == 1


def test_autotuned_option_parameters_get_the_configs_values(cache_dir):
    k = lazytriton.kernel(dk.option_params_tuned)
    for _ in range(2):
        x, out = torch.randn(N, device="cuda"), poisoned()
        k[grid](x, out, N)
        torch.cuda.synchronize()
        cfg = dk.option_params_tuned.configs[k.records[-1].winner_index]
        assert torch.equal(out, x * cfg.num_warps + cfg.num_stages)
        # Triton's own launch of that config binds the same values and launches with them.
        ref = poisoned()
        dk.option_params_tuned.fn[grid](x, ref, N, **cfg.all_kwargs())
        torch.cuda.synchronize()
        assert torch.equal(out, ref)


@pytest.mark.parametrize("how", ["keyword", "positional", "default"])
def test_plain_option_parameter_binds_as_in_triton(cache_dir, how):
    k = lazytriton.kernel(dk.option_params)
    x = torch.randn(N, device="cuda")
    args, kw = {"keyword": ((x, None, N), {"BLOCK": 256, "num_warps": 8}),
                "positional": ((x, None, N, 256, 8), {}),
                "default": ((x, None, N), {"BLOCK": 256})}[how]
    out, ref = poisoned(), poisoned()
    k[grid](*[out if a is None else a for a in args], **kw)
    dk.option_params[grid](*[ref if a is None else a for a in args], **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, ref) and not torch.isnan(out).any()


def test_option_parameters_on_the_jax_face(cache_dir):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np

    from lazytriton import jax as ltj

    n = 1 << 16
    g = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
    x = jnp.asarray(np.random.default_rng().standard_normal(n).astype(np.float32))
    tuned = jax.jit(lambda a: ltj.triton_call(a, kernel=dk.option_params_tuned, out_type=a, grid=g, n=n))(x)
    k = lazytriton.kernel(dk.option_params_tuned)  # the winner the JAX face persisted, read back
    ref = torch.full((n,), float("nan"), device="cuda")
    k[g](torch.from_dlpack(x), ref, n)
    torch.cuda.synchronize()
    assert k.records[-1].winner_index is not None
    np.testing.assert_array_equal(np.asarray(tuned), ref.cpu().numpy())
    plain = jax.jit(lambda a: ltj.triton_call(a, kernel=dk.option_params, out_type=a, grid=g, n=n, BLOCK=256,
                                              num_warps=8))(x)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(x) * 8)
