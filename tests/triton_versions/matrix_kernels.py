"""Representative kernels for the Triton version matrix (check.py): they must
compile with every Triton the matrix covers (3.5 on). A module of its own, so
that lazytriton's compile workers can import them by name."""
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["ns_i", "ns_p"], do_not_specialize_on_alignment=["na_i", "na_p"])
def scalars_and_pointers(p, ns_p, na_p, out, i, ns_i, na_i, big, flag, x, maybe, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = tl.load(p + offs) + tl.load(ns_p + offs) + tl.load(na_p + offs)
    v = v * x + (i + ns_i + na_i).to(tl.float32) + big.to(tl.float32)
    if flag:
        v = v + 1.0
    if maybe is not None:
        v = v + tl.load(maybe + offs)
    tl.store(out + offs, v)


@triton.jit
def annotated(out, n: tl.int64, m: tl.uint32, k: tl.int8, h: tl.float16, b: tl.int1, g: tl.float64,
              bf: tl.bfloat16, f: tl.float32, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    v = n.to(tl.float32) + m.to(tl.float32) + k.to(tl.float32) + h.to(tl.float32) + g.to(tl.float32)
    v = v + bf.to(tl.float32) + f
    v = tl.where(b, v, -v)
    tl.store(out + offs, v + offs)


@triton.jit
def constexpr_kinds(out, n, DT: tl.constexpr, SCALE: tl.constexpr, USE: tl.constexpr, BLOCK: tl.constexpr = 64):
    offs = tl.arange(0, BLOCK)
    v = offs.to(DT) * SCALE
    if USE:
        v = v + 1
    tl.store(out + offs, v.to(tl.float32), mask=offs < n)


def _prune(configs, named_args, **kwargs):
    # Drops the configs whose block exceeds n (keeps at least one).
    kept = [c for c in configs if c.kwargs["BLOCK"] <= max(named_args["n"], 64)]
    return kept or configs[:1]


@triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=2, num_stages=2),
                          triton.Config({"BLOCK": 128}, num_warps=4, num_stages=3),
                          triton.Config({"BLOCK": 1024}, num_warps=8, num_stages=4, maxnreg=128)],
                 key=["n"], prune_configs_by={"early_config_prune": _prune}, reset_to_zero=["acc"])
@triton.heuristics({"EVEN": lambda a: a["n"] % a["BLOCK"] == 0})
@triton.jit
def tuned_inner_heuristics(x, acc, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    if EVEN:
        v = tl.load(x + offs)
    else:
        v = tl.load(x + offs, mask=offs < n, other=0.0)
    tl.atomic_add(acc, tl.sum(v, axis=0))


@triton.heuristics({"HALF": lambda a: a["n"] // 2})
@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 256}, num_warps=8)], key=["n"])
@triton.jit
def tuned_outer_heuristics(x, out, n, HALF: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < HALF
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2, mask=m)


@triton.jit
def device_tma_copy(x, out, M, N, BM: tl.constexpr, BN: tl.constexpr):
    # Device-side tensor descriptors: global scratch (128-byte aligned) per program.
    src = tl.make_tensor_descriptor(x, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    dst = tl.make_tensor_descriptor(out, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    om = tl.program_id(0) * BM
    on = tl.program_id(1) * BN
    dst.store([om, on], src.load([om, on]))


@triton.jit
def blocked_add(x, y, out, n, BLOCK: tl.constexpr):
    # Compiled with num_ctas=2 (clusters) and with launch_pdl=True.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)


@triton.jit
def ws_matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # A warp-specialized K loop (tl.range(warp_specialize=True)) over device-side descriptors.
    a_d = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_d = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_d = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    om = tl.program_id(0) * BM
    on = tl.program_id(1) * BN
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    for k in tl.range(0, K, BK, warp_specialize=True):
        acc = tl.dot(a_d.load([om, k]), b_d.load([k, on]), acc)
    c_d.store([om, on], acc.to(tl.float16))
