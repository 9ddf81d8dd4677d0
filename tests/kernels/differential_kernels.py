"""Kernels for the differential test against Triton's own binder and launcher
(tests/fake_cuda/differential.py): between them, parameters of every kind a
call can vary on — pointers that may be None, strides that may be None, ints
near 1 / 16 / 2**31 / 2**63, bools, floats, annotated scalars,
do_not_specialize(_on_alignment), constexprs given by the call or derived by
heuristics, autotune keys, tuples, host tensor descriptors. Written like the
field's kernels (TransformerEngine's permutation, liger's norms): optional
inputs tested with `is not None` inside the kernel. Compiled with every Triton
CI covers (3.5 on). A module of its own, so lazytriton's compile workers can
import the kernels by name."""
import triton
import triton.language as tl


@triton.jit
def optional_inputs(x, y, out, scale_ptr, s_y, n, alpha, flag, BLOCK: tl.constexpr, HAS_SCALE: tl.constexpr):
    # y and scale_ptr may be None (as TransformerEngine's probs/scale/pad_offsets); s_y a stride or None.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m).to(tl.float32)
    if y is not None:
        if s_y is not None:
            v += tl.load(y + offs * s_y, mask=m).to(tl.float32)
        else:
            v += tl.load(y + offs, mask=m).to(tl.float32)
    if HAS_SCALE:
        v = v * tl.load(scale_ptr).to(tl.float32)
    if flag:
        v = v * alpha
    tl.store(out + offs, v, mask=m)


@triton.jit(do_not_specialize=["d"], do_not_specialize_on_alignment=["e", "q"])
def int_kinds(out, p, q, a, b, c: tl.int64, d, e, f: tl.float16, g: tl.int1, h: tl.uint32, k: tl.int8, x, t,
              BLOCK: tl.constexpr):
    # Every scalar reaches memory, so each parameter stays in the kernel's signature.
    tl.store(out + 0, a)
    tl.store(out + 1, b)
    tl.store(out + 2, c)
    tl.store(out + 3, d)
    tl.store(out + 4, e)
    tl.store(out + 5, f.to(tl.float32).to(tl.int64))
    tl.store(out + 6, g.to(tl.int64))
    tl.store(out + 7, h.to(tl.int64))
    tl.store(out + 8, k.to(tl.int64))
    tl.store(out + 9, (x * 2.0).to(tl.int64))
    if t:
        tl.store(out + 10, 1)
    offs = tl.arange(0, BLOCK)
    tl.store(out + 16 + offs, tl.load(p + offs).to(tl.int64) + tl.load(q + offs).to(tl.int64))


def _prune(configs, named_args, **kwargs):
    kept = [c for c in configs if c.kwargs["BLOCK"] <= max(named_args["n"], 64)]
    return kept or configs[:1]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 256}, num_warps=4)],
                 key=["n"], prune_configs_by={"early_config_prune": _prune})
@triton.heuristics({"EVEN": lambda a: a["n"] % a["BLOCK"] == 0, "HAS_BIAS": lambda a: a["bias"] is not None})
@triton.jit
def tuned_heuristics(x, bias, out, n, w, EVEN: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    # A heuristic reads a pointer that may be None (lazytriton evaluates it in Python per call).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        v = tl.load(x + offs)
    else:
        v = tl.load(x + offs, mask=offs < n, other=0.0)
    if HAS_BIAS:
        v += tl.load(bias + offs % 16)
    tl.store(out + offs, v * w, mask=offs < n)


@triton.heuristics({"WIDE": lambda a: a["n"] > 1000})
@triton.jit
def heuristic_on_int(x, out, n, WIDE: tl.constexpr, BLOCK: tl.constexpr):
    # A heuristic that reads only an int: lazytriton keys its stub on that value.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x + offs, mask=offs < n)
    if WIDE:
        v = v * 2
    tl.store(out + offs, v, mask=offs < n)


@triton.heuristics({"SCALE": lambda a: 2 * a.get("SCALE", 1) if a["n"] > 100 else 1})
@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2), triton.Config({"BLOCK": 128}, num_warps=4)],
                 key=["n"])
@triton.jit
def heuristic_over_tuned(x, out, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    # Heuristics above autotune run first, on the call's keywords: SCALE's reads a SCALE the call passes.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * SCALE, mask=m)


@triton.jit
def tuple_args(xs, out, n, BLOCK: tl.constexpr):
    # xs = (pointer, (int or None, float or None), pointer or None)
    offs = tl.arange(0, BLOCK)
    v = tl.load(xs[0] + offs).to(tl.float32)
    if xs[1][0] is not None:
        v += xs[1][0]
    if xs[1][1] is not None:
        v *= xs[1][1]
    if xs[2] is not None:
        v += tl.load(xs[2] + offs).to(tl.float32)
    tl.store(out + offs, v, mask=offs < n)


@triton.jit
def desc_scale(d_in, d_out, alpha, BM: tl.constexpr, BN: tl.constexpr):
    # Host tensor descriptors: specialized on dtype and block shape only.
    om = tl.program_id(0) * BM
    on = tl.program_id(1) * BN
    v = d_in.load([om, on])
    d_out.store([om, on], (v.to(tl.float32) * alpha).to(v.dtype))


@triton.jit
def double_tail(x, n, BLOCK: tl.constexpr):
    # The last BLOCK * programs elements of x doubled in place. With n beyond int32, Triton
    # types n i64 and the offsets are int64.
    offs = n - (tl.program_id(0) + 1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs) * 2)


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2, num_stages=2),
                          triton.Config({"BLOCK": 128}, num_warps=4, num_stages=3)], key=["n"])
@triton.jit
def option_params_tuned(x, out, n, BLOCK: tl.constexpr, num_warps: tl.constexpr, num_stages: tl.constexpr):
    # Parameters named like launch options: Triton binds the config's values to them (and launches with them).
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * num_warps + num_stages, mask=m)


@triton.jit
def option_params(x, out, n, BLOCK: tl.constexpr, num_warps: tl.constexpr = 4):
    # A plain kernel's num_warps parameter: a call's keyword is the parameter's value and the launch option.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * num_warps, mask=m)


@triton.heuristics({"num_warps": lambda a: 2 if a["n"] <= 256 else 8})
@triton.jit
def option_params_heuristic(x, out, n, BLOCK: tl.constexpr, num_warps: tl.constexpr):
    # A heuristic sets a parameter named like a launch option: Triton binds it and launches with it.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * num_warps, mask=m)
