"""Kernels as outside users write them, for the command-buffer matrix
(tests/test_gpu_capture_matrix.py): TransformerEngine-style row permutation
driven by an index map, and a Hopper matmul whose tensor descriptors are built
on the device (global scratch)."""
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w)
                          for b, w in ((64, 1), (128, 2), (256, 4), (512, 4), (1024, 8))],
                 key=["cols"])
@triton.jit
def permute_rows(inp, dst, out, cols, BLOCK: tl.constexpr):
    # out[dst[row]] = inp[row]: an index map that is not produced yet (or a
    # wrong `cols`) sends the stores out of bounds.
    row = tl.program_id(0)
    to = tl.load(dst + row).to(tl.int64)
    for c in range(0, cols, BLOCK):
        offs = c + tl.arange(0, BLOCK)
        m = offs < cols
        tl.store(out + to * cols + offs, tl.load(inp + row * cols + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BM": 128, "BN": 128, "BK": 64}, num_warps=8, num_stages=3),
                          triton.Config({"BM": 64, "BN": 128, "BK": 64}, num_warps=4, num_stages=3),
                          triton.Config({"BM": 128, "BN": 64, "BK": 32}, num_warps=4, num_stages=4)],
                 key=["M", "N", "K"])
@triton.jit
def device_tma_matmul(a, b, c, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    # Descriptors made on the device: Triton passes them global scratch.
    a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
    b_desc = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
    c_desc = tl.make_tensor_descriptor(c, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        acc = tl.dot(a_desc.load([pid_m * BM, k * BK]), b_desc.load([k * BK, pid_n * BN]), acc)
    c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.float16))


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 1), (512, 4), (2048, 8))],
                 key=["n"])
@triton.jit
def faulty_kernel(x, n, out, BLOCK: tl.constexpr):
    # The BLOCK=512 config reads far outside `x`: a tuning trial faults.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    src = x
    if BLOCK == 512:
        src = x + (1 << 40)
    tl.store(out + offs, tl.load(src + offs, mask=m), mask=m)
