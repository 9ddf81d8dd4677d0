"""The harness's workloads, each at the sizes it is measured at, with what it
moves and computes (for achieved TB/s and TFLOP/s) and how to run it from
torch (lazytriton, Triton's own launcher, torch's op) and from JAX
(lazytriton.jax, XLA's own op, jax-triton).

A torch setup returns a dict:
  run()        one lazytriton call (k[grid](...)) on the workload's arrays
  first()      optional: the first call, when it must differ from run() (the
               in-place update checks that tuning left exactly one update)
  triton()     optional: the same call through Triton's own launcher/autotuner
  ref(), ref_name   torch's op for the same result
  check()      True when lazytriton's output is right (float64/float32 reference)
  kernel, grid, args, meta   for timing every config (tuning quality)
  lazy         the LazyKernel (its records say which config won)
  same()       optional: after the first call, Triton's own launch of the
               config lazytriton chose (workloads with same_config=True)
A JAX setup returns a dict:
  paths        {system: step()}: step() runs one call, returns what to block on
  kinds        {system: "lazytriton" | "other"}
  check()      True when lazytriton.jax's output is right
  notes        why a system is missing (jax-triton not importable, ...)

The TMA workloads (Triton's tutorials 09 and 06, kernels_tma.py) need a
Hopper GPU; elsewhere their setup raises and the section notes it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class Workload:
    name: str                       # as shown in tables: "softmax 8192x4096 fp16"
    bytes: int                      # bytes a perfect kernel moves
    flops: int                      # flops it computes (0: none counted)
    bound: str                      # "memory" (rate in GB/s vs copy bandwidth) or "compute" (TFLOP/s vs matmul)
    torch: Callable[[], dict] | None = None
    jax: Callable[[], dict] | None = None
    suites: tuple = ("quick", "full")
    tuning: bool = True             # in the tuning-quality section (autotuned kernels)
    same_config: bool = False       # also timed: Triton's own launch of the config lazytriton chose
    jax_triton: bool = True         # a jax-triton row beside lazytriton.jax (its setup says why not)
    notes: list = field(default_factory=list)


# -- torch setups --------------------------------------------------------------------------


def _stream():
    import torch

    return torch.cuda.current_stream().cuda_stream


def _t_vector_add(n: int) -> Callable[[], dict]:
    def setup():
        import torch
        import triton

        import lazytriton

        from .kernels import add

        x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
        out = torch.full_like(x, float("nan"))
        k, s = lazytriton.kernel(add), _stream()
        grid = (triton.cdiv(n, 1024),)
        return dict(run=lambda: k[grid](x, y, out, n, BLOCK=1024, stream=s),
                    triton=lambda: add[grid](x, y, out, n, BLOCK=1024),
                    ref=lambda: torch.add(x, y), ref_name="torch.add",
                    check=lambda: torch.equal(out, x + y), kernel=add, grid=lambda m: grid, args=(x, y, out, n),
                    meta={"BLOCK": 1024}, lazy=k)
    return setup


def _t_softmax(rows: int, cols: int, kernel_name: str = "softmax") -> Callable[[], dict]:
    def setup():
        import torch
        import triton

        import lazytriton

        from . import kernels as bk

        kern = getattr(bk, kernel_name)
        x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
        y = torch.full_like(x, float("nan"))
        k, s = lazytriton.kernel(kern), _stream()
        blk = triton.next_power_of_2(cols)
        args = (x, y, rows, cols, cols)
        if kernel_name == "softmax_rows":
            grid = lambda m: (triton.cdiv(rows, m["ROWS"]),)  # noqa: E731
        else:
            grid = lambda m: (rows,)  # noqa: E731
        want = torch.softmax(x.double(), -1).float()
        return dict(run=lambda: k[grid](*args, BLOCK=blk, stream=s), triton=lambda: kern[grid](*args, BLOCK=blk),
                    ref=lambda: torch.softmax(x, -1), ref_name="torch.softmax",
                    check=lambda: torch.allclose(y.float(), want, atol=2e-3, rtol=0), kernel=kern, grid=grid,
                    args=args, meta={"BLOCK": blk}, lazy=k)
    return setup


def _t_layer_norm(rows: int, cols: int) -> Callable[[], dict]:
    def setup():
        import torch
        import triton

        import lazytriton

        from .kernels import layer_norm

        x = torch.randn(rows, cols, device="cuda", dtype=torch.float16)
        w, b = torch.rand(cols, device="cuda") + 0.5, torch.randn(cols, device="cuda")
        y = torch.full_like(x, float("nan"))
        k, s = lazytriton.kernel(layer_norm), _stream()
        blk = triton.next_power_of_2(cols)
        args = (x, y, w, b, cols, cols, 1e-5)
        want = torch.nn.functional.layer_norm(x.double(), (cols,), w.double(), b.double(), 1e-5).float()
        wh, bh = w.half(), b.half()
        return dict(run=lambda: k[(rows,)](*args, BLOCK=blk, stream=s),
                    triton=lambda: layer_norm[(rows,)](*args, BLOCK=blk),
                    ref=lambda: torch.nn.functional.layer_norm(x, (cols,), wh, bh, 1e-5), ref_name="torch layer_norm",
                    check=lambda: torch.allclose(y.float(), want, atol=3e-2, rtol=0), kernel=layer_norm,
                    grid=lambda m: (rows,), args=args, meta={"BLOCK": blk}, lazy=k)
    return setup


def _t_matmul(m: int, n: int, kk: int) -> Callable[[], dict]:
    def setup():
        import torch
        import triton

        import lazytriton
        from lazytriton.demo_kernels import demo_matmul

        a = torch.randn(m, kk, device="cuda", dtype=torch.float16)
        b = torch.randn(kk, n, device="cuda", dtype=torch.float16)
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        k, s = lazytriton.kernel(demo_matmul), _stream()
        args = (a, b, c, m, n, kk, kk, 1, n, 1, n, 1)
        grid = lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"]))  # noqa: E731
        want = a.float() @ b.float()
        tol = 2e-2 * want.abs().max().item() + 1e-2
        return dict(run=lambda: k[grid](*args, stream=s), triton=lambda: demo_matmul[grid](*args),
                    ref=lambda: a @ b, ref_name="torch.matmul (cuBLAS)",
                    check=lambda: (c.float() - want).abs().max().item() <= tol, kernel=demo_matmul, grid=grid,
                    args=args, meta={}, lazy=k)
    return setup


def _t_permute(rows: int, cols: int) -> Callable[[], dict]:
    def setup():
        import torch

        import lazytriton

        from .kernels import permute_rows

        inp = torch.randn(rows, cols, device="cuda")
        dst = torch.randperm(rows, device="cuda", dtype=torch.int32)
        out = torch.full_like(inp, float("nan"))
        k, s = lazytriton.kernel(permute_rows), _stream()
        args = (inp, dst, out, cols)
        dst64, scratch = dst.long(), torch.empty_like(inp)
        want = torch.empty_like(inp).index_copy_(0, dst64, inp)
        return dict(run=lambda: k[(rows,)](*args, stream=s), triton=lambda: permute_rows[(rows,)](*args),
                    ref=lambda: scratch.index_copy_(0, dst64, inp), ref_name="torch index_copy_",
                    check=lambda: torch.equal(out, want), kernel=permute_rows, grid=lambda m: (rows,), args=args,
                    meta={}, lazy=k)
    return setup


def _t_inplace(n: int) -> Callable[[], dict]:
    def setup():
        import torch
        import triton

        import lazytriton

        from .kernels import scale_inplace

        x = torch.randn(n, device="cuda")
        x0 = x.clone()
        k, s = lazytriton.kernel(scale_inplace), _stream()
        grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731
        first = {}

        def first_call():  # tuning runs every config on x: the result must be one update
            k[grid](x, n, 2.0, stream=s)
            torch.cuda.synchronize()
            first["ok"] = torch.equal(x, x0 * 2)

        # alpha 1: repeatable, so timing and Triton's autotuner leave x as the first call did
        return dict(run=lambda: k[grid](x, n, 1.0, stream=s), first=first_call,
                    triton=lambda: scale_inplace[grid](x, n, 1.0), ref=lambda: x.mul_(1.0), ref_name="torch mul_",
                    check=lambda: first.get("ok", False) and torch.equal(x, x0 * 2), kernel=scale_inplace,
                    grid=grid, args=(x, n, 1.0), meta={}, lazy=k)
    return setup


def same_config(lazy, kernel, grid, args: tuple, meta: dict) -> Callable[[], Callable[[], None]]:
    """make() -> a call of Triton's own launcher (kernel.fn[grid]) with the
    config lazytriton chose: its meta-parameters and options, and `args`'
    host descriptors given the block shapes that config's pre_hook sets (as
    Triton's autotuner would). make() reads the winner: call it after the
    first lazytriton call."""
    def make():
        cfg = lazy.spec.configs[lazy.records[-1].winner_index]
        if cfg.pre_hook is not None:
            cfg.pre_hook({**dict(zip(kernel.fn.arg_names, args)), **meta, **cfg.all_kwargs()})
        opts = {f: getattr(cfg, f) for f in ("num_warps", "num_stages", "num_ctas") if getattr(cfg, f, None)}
        g = grid({**meta, **cfg.kwargs})
        return lambda: kernel.fn[g](*args, **meta, **cfg.kwargs, **opts)
    return make


def _hopper() -> None:
    import torch

    if torch.cuda.get_device_capability()[0] != 9:
        raise RuntimeError(f"needs a Hopper GPU (TMA tutorial kernels), not {torch.cuda.get_device_name()}")


def _t_tma_matmul(m: int, n: int, kk: int) -> Callable[[], dict]:
    def setup():
        import torch
        import triton
        from triton.tools.tensor_descriptor import TensorDescriptor

        import lazytriton

        from .kernels_tma import matmul_kernel_tma_persistent as kern

        _hopper()
        sms = torch.cuda.get_device_properties("cuda").multi_processor_count
        a = torch.randn(m, kk, device="cuda", dtype=torch.float16)
        b = torch.randn(n, kk, device="cuda", dtype=torch.float16)  # tutorial 09: C = A @ B.T
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)

        def descs():  # the tutorial's: each config's pre_hook sets the block shapes
            return tuple(TensorDescriptor.from_tensor(t, [1, 1]) for t in (a, b, c))

        def grid(meta):
            return (min(sms, triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"])),)

        meta = dict(FP8_OUTPUT=False, NUM_SMS=sms, WARP_SPECIALIZE=False)
        k, s = lazytriton.kernel(kern), _stream()
        args, theirs = (*descs(), m, n, kk), (*descs(), m, n, kk)
        want = a.float() @ b.float().T
        tol = 2e-2 * want.abs().max().item() + 1e-2
        return dict(run=lambda: k[grid](*args, stream=s, **meta), triton=lambda: kern[grid](*theirs, **meta),
                    same=same_config(k, kern, grid, (*descs(), m, n, kk), meta),
                    ref=lambda: a @ b.T, ref_name="torch.matmul (cuBLAS)",
                    check=lambda: (c.float() - want).abs().max().item() <= tol, kernel=kern, grid=grid, args=args,
                    meta=meta, lazy=k)
    return setup


def _t_attention(z: int, h: int, n_ctx: int, d: int, causal: bool) -> Callable[[], dict]:
    def setup():
        import torch
        import triton
        from triton.tools.tensor_descriptor import TensorDescriptor

        import lazytriton

        from .kernels_tma import attn_fwd as kern

        _hopper()
        q, k_, v = (torch.randn((z, h, n_ctx, d), device="cuda", dtype=torch.float16) for _ in range(3))
        o = torch.full_like(q, float("nan"))
        lse = torch.empty((z, h, n_ctx), device="cuda", dtype=torch.float32)
        y, scale = z * h * n_ctx, d ** -0.5

        def descs():  # tutorial 06's host descriptors over (Z*H*N_CTX, HEAD_DIM) views
            return tuple(TensorDescriptor(t, shape=[y, d], strides=[d, 1], block_shape=[1, 1]) for t in (q, k_, v, o))

        def grid(meta):
            return (triton.cdiv(n_ctx, meta["BLOCK_M"]), z * h, 1)

        meta = dict(N_CTX=n_ctx, HEAD_DIM=d, FP8_OUTPUT=False, STAGE=3 if causal else 1, warp_specialize=False,
                    IS_HOPPER=True)
        lk, s = lazytriton.kernel(kern), _stream()
        args, theirs = (scale, lse, z, h, *descs()), (scale, lse, z, h, *descs())
        sdpa = torch.nn.functional.scaled_dot_product_attention
        want = sdpa(q.float(), k_.float(), v.float(), is_causal=causal, scale=scale)
        return dict(run=lambda: lk[grid](*args, stream=s, **meta), triton=lambda: kern[grid](*theirs, **meta),
                    same=same_config(lk, kern, grid, (scale, lse, z, h, *descs()), meta),
                    ref=lambda: sdpa(q, k_, v, is_causal=causal, scale=scale),
                    ref_name="torch scaled_dot_product_attention",
                    check=lambda: torch.allclose(o.float(), want, atol=1e-2, rtol=0), kernel=kern, grid=grid,
                    args=args, meta=meta, lazy=lk)
    return setup


# -- JAX setups ----------------------------------------------------------------------------


def _jax_triton():
    """jax_triton.triton_call, or (None, why)."""
    try:
        import jax_triton

        return jax_triton.triton_call, None
    except Exception as exc:  # noqa: BLE001  (absent, or built for another Triton/jax)
        return None, f"jax-triton not importable ({type(exc).__name__}: {str(exc)[:120]})"


def lazy_triton_call(*args, out_shape, **kwargs):
    """lazytriton.jax.triton_call taking jax-triton 0.3's out_shape= (a call
    written once for both: jax-triton 0.4 still takes out_shape=)."""
    from lazytriton.jax import triton_call

    return triton_call(*args, out_type=out_shape, **kwargs)


def _jax_paths(lazy_call: Callable, xla: Callable, xla_name: str, args: tuple, jt_call: Callable | None = None,
               donate: tuple = ()) -> dict:
    """Jitted paths over the same arguments: lazytriton.jax, XLA's op and, when
    importable, jax-triton (the same triton_call arguments)."""
    import jax

    triton_call = lazy_triton_call

    jt, why = _jax_triton()
    fns = {"lazytriton.jax triton_call": (jax.jit(lambda *a: lazy_call(triton_call, *a), donate_argnums=donate),
                                          "lazytriton"),
           f"XLA: {xla_name}": (jax.jit(xla, donate_argnums=donate), "other")}
    notes = []
    if jt is not None and jt_call is not None:
        fns["jax-triton triton_call"] = (jax.jit(lambda *a: jt_call(jt, *a), donate_argnums=donate), "other")
    elif why:
        notes.append(why + ": no jax-triton row")
    return {"fns": fns, "args": args, "notes": notes}


def _j_softmax(rows: int, cols: int) -> Callable[[], dict]:
    def setup():
        import jax
        import jax.numpy as jnp
        import numpy as np
        import triton

        from .kernels import softmax

        x = jnp.asarray(np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32), jnp.float16)
        blk = triton.next_power_of_2(cols)

        def call(tc, x):
            return tc(x, n_rows=rows, n_cols=cols, stride=cols, kernel=softmax, out_shape=x, grid=(rows,), BLOCK=blk)

        want = np.asarray(jax.nn.softmax(x.astype(jnp.float32), axis=-1))
        p = _jax_paths(call, lambda x: jax.nn.softmax(x, axis=-1), "jax.nn.softmax", (x,), call)
        p["check"] = lambda out: np.allclose(np.asarray(out, np.float32), want, atol=2e-3, rtol=0)
        return p
    return setup


def _j_layer_norm(rows: int, cols: int) -> Callable[[], dict]:
    def setup():
        import jax
        import jax.numpy as jnp
        import numpy as np
        import triton

        from .kernels import layer_norm

        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal((rows, cols), dtype=np.float32), jnp.float16)
        w = jnp.asarray(rng.random(cols) + 0.5, jnp.float32)
        b = jnp.asarray(rng.standard_normal(cols, dtype=np.float32), jnp.float32)
        blk = triton.next_power_of_2(cols)

        def call(tc, x, w, b):
            return tc(x, w=w, b=b, n_cols=cols, stride=cols, eps=1e-5, kernel=layer_norm, out_shape=x,
                      grid=(rows,), BLOCK=blk)

        def xla(x, w, b):
            v = x.astype(jnp.float32)
            mean = v.mean(-1, keepdims=True)
            var = ((v - mean) ** 2).mean(-1, keepdims=True)
            return ((v - mean) / jnp.sqrt(var + 1e-5) * w + b).astype(x.dtype)

        @jax.jit
        def ref(x, w, b):  # float32 throughout, on the device: not XLA's op under test (that one is fp16 out)
            v = x.astype(jnp.float32)
            mean = v.mean(-1, keepdims=True)
            return (v - mean) * jax.lax.rsqrt(((v - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * w + b

        want = np.asarray(ref(x, w, b))
        # No jax-triton row: the kernel's weights follow its output, so they are passed by keyword
        # (jax-triton 0.4's rule); jax-triton 0.3 takes keywords as meta-parameters only.
        p = _jax_paths(call, xla, "layer norm (jnp, fused by XLA)", (x, w, b))
        p["notes"].append("no jax-triton row: its weights are passed by keyword, which jax-triton 0.3 cannot "
                          "(0.4 can; it needs triton >= 3.7)")
        p["check"] = lambda out: np.allclose(np.asarray(out, np.float32), want, atol=3e-2, rtol=0)
        return p
    return setup


def _j_matmul(m: int, n: int, kk: int, jax_triton: bool = True) -> Callable[[], dict]:
    def setup():
        import jax
        import jax.numpy as jnp
        import numpy as np
        import triton

        from lazytriton.demo_kernels import demo_matmul

        rng = np.random.default_rng(0)
        a = jnp.asarray(rng.standard_normal((m, kk), dtype=np.float32), jnp.float16)
        b = jnp.asarray(rng.standard_normal((kk, n), dtype=np.float32), jnp.float16)

        def call(tc, a, b):
            return tc(a, b, M=m, N=n, K=kk, sam=kk, sak=1, sbk=n, sbn=1, scm=n, scn=1, kernel=demo_matmul,
                      out_shape=jax.ShapeDtypeStruct((m, n), jnp.float16),
                      grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])))

        # float32 on the host: an XLA float32 HIGHEST-precision dot would autotune its GEMM in every process
        want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
        tol = 2e-2 * np.abs(want).max() + 1e-2
        p = _jax_paths(call, jnp.dot, "jnp.dot (cuBLAS)", (a, b), call if jax_triton else None)
        if not jax_triton:
            p["notes"].append("no jax-triton row at this shape (its 4096^3 row compares it): jax-triton compiles "
                              "every config at each lowering, about 5 s a shape, which the budget keeps for the "
                              "other rows")
        p["check"] = lambda out: float(np.abs(np.asarray(out, np.float32) - want).max()) <= tol
        return p
    return setup


def _j_permute(rows: int, cols: int) -> Callable[[], dict]:
    def setup():
        import jax.numpy as jnp
        import numpy as np

        from .kernels import permute_rows

        rng = np.random.default_rng(0)
        inp = jnp.asarray(rng.standard_normal((rows, cols), dtype=np.float32), jnp.float32)
        perm = rng.permutation(rows).astype(np.int32)
        dst = jnp.asarray(perm)

        def call(tc, inp, dst):
            return tc(inp, dst, cols=cols, kernel=permute_rows, out_shape=inp, grid=(rows,))

        def xla(inp, dst):
            return jnp.zeros_like(inp).at[dst].set(inp, unique_indices=True)

        want = np.empty((rows, cols), np.float32)
        want[perm] = np.asarray(inp)
        p = _jax_paths(call, xla, "x.at[dst].set (scatter)", (inp, dst), call)
        p["check"] = lambda out: np.array_equal(np.asarray(out), want)
        return p
    return setup


def _j_inplace(n: int) -> Callable[[], dict]:
    def setup():
        import jax
        import jax.numpy as jnp
        import numpy as np
        import triton

        from .kernels import scale_inplace

        x0 = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
        grid = lambda m: (triton.cdiv(n, m["BLOCK"]),)  # noqa: E731

        def scaled(alpha):
            def call(tc, x, a):  # alpha: a Python float, i.e. a kernel scalar fixed at trace time
                return tc(x, n, alpha, kernel=scale_inplace, out_shape=x, input_output_aliases={0: 0}, grid=grid)
            return call

        # alpha 1.0 in the timed calls: repeatable on the donated buffer. The
        # first execution (which tunes, every config run on x) uses 2.0 and
        # must leave exactly one update: 2 * x0.
        p = _jax_paths(scaled(1.0), lambda x, a: x * a, "x * alpha (donated)", (jnp.asarray(x0), jnp.float32(1.0)),
                       scaled(1.0), donate=(0,))
        first = jax.jit(lambda x, a: scaled(2.0)(lazy_triton_call, x, a), donate_argnums=(0,))
        p["first"] = (first, lambda out: np.array_equal(np.asarray(out), x0 * 2))
        p["check"] = lambda out: np.array_equal(np.asarray(out), x0 * 2)  # the state after first, then x 1.0
        return p
    return setup


def _j_vector_add(n: int) -> Callable[[], dict]:
    def setup():
        import jax.numpy as jnp
        import numpy as np
        import triton

        from .kernels import add

        rng = np.random.default_rng(0)
        x = jnp.asarray(rng.standard_normal(n, dtype=np.float32), jnp.float32)
        y = jnp.asarray(rng.standard_normal(n, dtype=np.float32), jnp.float32)

        def call(tc, x, y):
            return tc(x, y, n=n, kernel=add, out_shape=x, grid=(triton.cdiv(n, 1024),), BLOCK=1024)

        want = np.asarray(x) + np.asarray(y)
        p = _jax_paths(call, lambda x, y: x + y, "x + y", (x, y), call)
        p["check"] = lambda out: np.array_equal(np.asarray(out), want)
        return p
    return setup


# -- the catalogue -------------------------------------------------------------------------


def _mm(m: int, n: int, k: int, suites=("quick", "full"), jax_triton: bool = True) -> Workload:
    return Workload(f"matmul {m}x{n}x{k} fp16" if len({m, n, k}) > 1 else f"matmul {m}^3 fp16",
                    bytes=2 * (m * k + k * n + m * n), flops=2 * m * n * k, bound="compute",
                    torch=_t_matmul(m, n, k), jax=_j_matmul(m, n, k, jax_triton), suites=suites, jax_triton=jax_triton)


def _tma_mm(m: int, n: int, k: int, suites=("quick", "full")) -> Workload:
    # 48 configs: tuning quality would compile each again through Triton, serially: not in that section.
    return Workload(f"TMA persistent matmul {m}x{n}x{k} fp16 (tutorial 09)" if len({m, n, k}) > 1 else
                    f"TMA persistent matmul {m}^3 fp16 (tutorial 09)", bytes=2 * (m * k + k * n + m * n),
                    flops=2 * m * n * k, bound="compute", torch=_t_tma_matmul(m, n, k), suites=suites, tuning=False,
                    same_config=True)


def _attn(z: int, h: int, n_ctx: int, d: int, suites=("quick", "full")) -> Workload:
    # causal: half the score matrix is computed
    return Workload(f"flash attention fwd {z}x{h}x{n_ctx}x{d} causal fp16 (tutorial 06, TMA)",
                    bytes=2 * 4 * z * h * n_ctx * d, flops=2 * z * h * n_ctx * n_ctx * d, bound="compute",
                    torch=_t_attention(z, h, n_ctx, d, True), suites=suites, tuning=False, same_config=True)


def selected(workloads: list[Workload]) -> list[Workload]:
    """The workloads $LAZYTRITON_BENCH_WORKLOADS names (comma-separated parts of
    their names, case-sensitive: "TMA" is not in "softmax"; `lazytriton bench
    --workloads`), or all."""
    want = [w.strip() for w in os.environ.get("LAZYTRITON_BENCH_WORKLOADS", "").split(",") if w.strip()]
    return [w for w in workloads if not want or any(x in w.name for x in want)]


def throughput_workloads(suite: str) -> list[Workload]:
    """The bandwidth- and compute-bound sizes (kernel time, achieved rate)."""
    r, c = 8192, 4096
    out = [
        Workload("vector add 64M fp32", bytes=12 << 26, flops=1 << 26, bound="memory",
                 torch=_t_vector_add(1 << 26), jax=_j_vector_add(1 << 26), tuning=False),
        Workload(f"softmax {r}x{c} fp16", bytes=4 * r * c, flops=4 * r * c, bound="memory",
                 torch=_t_softmax(r, c), jax=_j_softmax(r, c)),
        Workload(f"layer norm {r}x{c} fp16", bytes=4 * r * c + 8 * c, flops=7 * r * c, bound="memory",
                 torch=_t_layer_norm(r, c), jax=_j_layer_norm(r, c), jax_triton=False),
        _mm(4096, 4096, 4096),
        _mm(1024, 1024, 8192, suites=("full",), jax_triton=False),
        _mm(8192, 256, 4096, suites=("full",), jax_triton=False),
        Workload("permute rows 8192x2048 fp32 (index-driven)", bytes=8 * 8192 * 2048 + 4 * 8192, flops=0,
                 bound="memory", torch=_t_permute(8192, 2048), jax=_j_permute(8192, 2048)),
        Workload("in-place scale 64M fp32 (aliased, autotuned)", bytes=8 << 26, flops=1 << 26, bound="memory",
                 torch=_t_inplace(1 << 26), jax=_j_inplace(1 << 26)),
        Workload("softmax 16384x1024 fp16, 9 configs", bytes=4 * 16384 * 1024, flops=4 * 16384 * 1024,
                 bound="memory", torch=_t_softmax(16384, 1024, "softmax_rows"), suites=("full",)),
        _tma_mm(4096, 4096, 4096),
        _attn(4, 32, 2048, 128),
    ]
    return selected([w for w in out if suite in w.suites])


def small_workloads(suite: str) -> list[Workload]:
    """Launch-bound sizes: what a call costs back to back (host clock); the full suite only."""
    full = ("full",)
    out = [
        Workload("softmax 32x1024 fp16", bytes=4 * 32 * 1024, flops=4 * 32 * 1024, bound="memory",
                 torch=_t_softmax(32, 1024), suites=full),
        Workload("layer norm 32x1024 fp16", bytes=4 * 32 * 1024, flops=7 * 32 * 1024, bound="memory",
                 torch=_t_layer_norm(32, 1024), suites=full),
        _mm(128, 128, 128, suites=full),
        Workload("permute rows 64x256 fp32", bytes=8 * 64 * 256, flops=0, bound="memory", torch=_t_permute(64, 256),
                 suites=full),
        Workload("in-place scale 4096 fp32", bytes=8 * 4096, flops=4096, bound="memory", torch=_t_inplace(4096),
                 suites=full),
        _tma_mm(512, 512, 512, suites=full),
        _attn(1, 4, 512, 64, suites=full),
    ]
    return selected([w for w in out if suite in w.suites])
