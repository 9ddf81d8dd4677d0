"""Kernels whose configs fault or hang, for the isolated first launch (issue 50,
tests/test_gpu_isolation.py): each copies x into out, as its good configs do."""
import triton
import triton.language as tl

FAR = tl.constexpr(1 << 40)  # elements past the buffer: an address no allocation holds (an illegal address)


@triton.autotune(configs=[triton.Config({"BLOCK": b, "FAULT": f}, num_warps=w)
                          for b, f, w in ((128, 0, 1), (512, 1, 4), (1024, 0, 8))], key=["n"])
@triton.jit
def one_faulty(x, n, out, BLOCK: tl.constexpr, FAULT: tl.constexpr):
    # Config 1 reads far outside x: its first launch faults.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    src = x
    if FAULT:
        src = x + FAR
    tl.store(out + offs, tl.load(src + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 1), (512, 4))], key=["n"])
@triton.jit
def all_faulty(x, n, out, BLOCK: tl.constexpr):
    # Every config reads far outside x.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out + offs, tl.load(x + FAR + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b, "SPIN": s}, num_warps=w)
                          for b, s, w in ((128, 1, 1), (512, 0, 4))], key=["n"])
@triton.jit
def one_hanging(x, n, out, flag, BLOCK: tl.constexpr, SPIN: tl.constexpr):
    # Config 0 spins until *flag becomes non-zero, which nothing ever writes: it never ends.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    if SPIN:
        go = tl.load(flag, volatile=True)
        while go == 0:
            go = tl.load(flag, volatile=True)
    tl.store(out + offs, tl.load(x + offs, mask=m), mask=m)


# num_warps 1, 2, 4: blocks of 32, 64, 128 threads, so that the stand-in driver (tests/fake_cuda) can
# fault or hang a config by its block size (tests/test_isolation.py, on the CPU).
@triton.autotune(configs=[triton.Config({"B": 64 << i}, num_warps=w) for i, w in enumerate((1, 2, 4))], key=["n"])
@triton.jit
def scale(x, out, n, B: tl.constexpr):
    o = tl.program_id(0) * B + tl.arange(0, B)
    tl.store(out + o, tl.load(x + o, mask=o < n) * 2, mask=o < n)
