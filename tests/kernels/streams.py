"""Kernels for tests/test_gpu_torch_streams.py (PyTorch streams, CUDA graphs, option-named parameters)."""
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 512}, num_warps=8)],
                 key=["n"])
@triton.jit
def scale_add(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * 2.0 + 1.0, mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": 128}, num_warps=2, num_stages=2),
                          triton.Config({"BLOCK": 256}, num_warps=4, num_stages=3),
                          triton.Config({"BLOCK": 512}, num_warps=8, num_stages=4)], key=["n"])
@triton.jit
def option_params_tuned(x, out, n, BLOCK: tl.constexpr, num_warps: tl.constexpr, num_stages: tl.constexpr):
    # A flash-attention forward's idiom: the config's launch options read as parameters.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * num_warps + num_stages, mask=m)


@triton.jit
def option_params(x, out, n, BLOCK: tl.constexpr, num_warps: tl.constexpr = 4):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + offs, mask=m) * num_warps, mask=m)
