"""Kernels taking host-side TMA tensor descriptors (Triton's TensorDescriptor).

The matmul and attention kernels are Triton's own tutorials 09 and 06,
release 3.6, verbatim in lazytriton.bench.kernels_tma (the harness runs them
too): each autotune config's pre_hook sets the descriptors' block shapes.
"""
import triton
import triton.language as tl

from lazytriton.bench.kernels_tma import (  # noqa: F401  (the tests use them from here)
    attn_fwd, matmul_kernel_tma_persistent, matmul_tma_persistent_get_configs, matmul_tma_set_block_size_hook)


@triton.jit
def tma_copy_kernel(in_desc, out_ptr, M: tl.constexpr, N: tl.constexpr):
    # jax-triton 0.4's test_host_side_tma_copy kernel: one block, stored densely.
    block = in_desc.load([0, 0])
    offs = tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(out_ptr + offs, block)


@triton.jit
def tma_block_load_kernel(in_desc, out_ptr, row, col, BM: tl.constexpr, BN: tl.constexpr):
    # Each program loads the block at (row + pid * BM, col): rows and columns past
    # the tensor's edge read the descriptor's padding (0, or NaN for padding="nan").
    block = in_desc.load([row + tl.program_id(0) * BM, col])
    offs = tl.program_id(0) * BM * BN + tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    tl.store(out_ptr + offs, block)


@triton.jit
def tma_scale_store_kernel(in_desc, out_desc, alpha, BM: tl.constexpr, BN: tl.constexpr):
    # out[tile] = in[tile] * alpha through two descriptors (a store past the edge is clipped).
    r = tl.program_id(0) * BM
    c = tl.program_id(1) * BN
    out_desc.store([r, c], (in_desc.load([r, c]) * alpha).to(out_desc.dtype))


@triton.jit
def tma_tuple_descs(p, descs, out_ptr, k, M: tl.constexpr, N: tl.constexpr):
    # descs = (a_desc (rank 3), (b_desc, scale, one)): descriptors inside a nested tuple, beside
    # scalars (Triton 3.5/3.6's own launcher refuses this; the kernel takes each leaf's expansion
    # in order). Program i: out[i] = a[i, :M, :N] + b[i*M:(i+1)*M, :N] * scale + one + p[0] + k.
    i = tl.program_id(0)
    a = tl.reshape(descs[0].load([i, 0, 0]), (M, N))
    b = descs[1][0].load([i * M, 0])
    offs = i * M * N + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :]
    tl.store(out_ptr + offs, a + b * descs[1][1] + descs[1][2] + tl.load(p) + k)


def set_blocks_hook(nargs):
    # The pre_hook idiom with a 1-D grid of row tiles.
    nargs["in_desc"].block_shape = [nargs["BM"], nargs["BN"]]
    nargs["out_desc"].block_shape = [nargs["BM"], nargs["BN"]]


@triton.autotune(configs=[triton.Config({"BM": 32, "BN": 64}, num_warps=4, pre_hook=set_blocks_hook),
                          triton.Config({"BM": 64, "BN": 32}, num_warps=4, pre_hook=set_blocks_hook),
                          triton.Config({"BM": 16, "BN": 128}, num_warps=2, pre_hook=set_blocks_hook)],
                 key=["alpha"])
@triton.jit
def tma_scale_autotuned(in_desc, out_desc, alpha, BM: tl.constexpr, BN: tl.constexpr):
    r = tl.program_id(0) * BM
    c = tl.program_id(1) * BN
    out_desc.store([r, c], (in_desc.load([r, c]) * alpha).to(out_desc.dtype))


# Tutorial 09's kernel with 4 of its 48 configs (BLOCK_SIZE_K 64, 3 stages, 8 warps), to keep
# the tests that tune it more than once short; importable by name (C++ lazy mode).
matmul_kernel_tma_persistent_small = triton.autotune(
    configs=[c for c in matmul_tma_persistent_get_configs(pre_hook=matmul_tma_set_block_size_hook)
             if c.num_stages == 3 and c.kwargs["BLOCK_SIZE_K"] == 64 and c.num_warps == 8],
    key=["M", "N", "K", "WARP_SPECIALIZE"],
)(matmul_kernel_tma_persistent.fn)
