"""Gluon kernels (@triton.experimental.gluon.jit) for tests/test_gluon.py and
tests/test_gpu_gluon.py. Layouts are explicit; WARPS must equal the launch's
num_warps (Triton 3.5's Gluon has no gl.num_warps())."""
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def vec_add(x, y, out, n, BLOCK: gl.constexpr, WARPS: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[4], threads_per_warp=[32], warps_per_cta=[WARPS],
                                            order=[0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    m = offs < n
    gl.store(out + offs, gl.load(x + offs, mask=m) + gl.load(y + offs, mask=m), mask=m)


@triton.autotune(configs=[triton.Config({"BLOCK": b, "WARPS": w}, num_warps=w) for b, w in ((256, 2), (512, 4),
                                                                                          (2048, 8))],
                 key=["n"])
@gluon.jit
def vec_add_tuned(x, y, out, n, BLOCK: gl.constexpr, WARPS: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[4], threads_per_warp=[32], warps_per_cta=[WARPS],
                                            order=[0])
    offs = gl.program_id(0) * BLOCK + gl.arange(0, BLOCK, layout=layout)
    m = offs < n
    gl.store(out + offs, gl.load(x + offs, mask=m) + gl.load(y + offs, mask=m), mask=m)


@gluon.jit
def scale_rows(x, y, out, M, N, stride_x, stride_out, alpha: gl.float32,
               BM: gl.constexpr, BN: gl.constexpr, WARPS: gl.constexpr):
    # out[i, j] = alpha * x[i, j] + y[j], in a 2D blocked layout (rows across warps).
    layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 4], threads_per_warp=[4, 8],
                                            warps_per_cta=[WARPS, 1], order=[1, 0])
    rows = gl.program_id(0) * BM + gl.arange(0, BM, layout=gl.SliceLayout(1, layout))
    cols = gl.program_id(1) * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, layout))
    r = gl.expand_dims(rows, 1)
    c = gl.expand_dims(cols, 0)
    m = (r < M) & (c < N)
    v = gl.load(x + r * stride_x + c, mask=m)
    b = gl.load(y + c, mask=c < N)
    gl.store(out + r * stride_out + c, v * alpha + b, mask=m)


@gluon.jit
def copy_scalar(in_ptr, out_ptr):
    gl.store(out_ptr, gl.load(in_ptr))


@gluon.jit
def memcpy(in_ptr, out_ptr, size: gl.constexpr, block_size: gl.constexpr):
    # jax-triton 0.4's gluon_test kernel: scalar loads, no layout.
    pid = gl.program_id(0)
    start = pid * block_size
    end = min(start + block_size, size)
    for i in range(start, end):
        gl.store(out_ptr + i, gl.load(in_ptr + i))


try:  # Gluon's device-side TMA descriptors: Triton 3.6+ (Hopper and newer)
    from triton.experimental.gluon.language.nvidia import hopper as gl_hopper
    HAVE_DEVICE_TMA = hasattr(gl_hopper.tma, "make_tensor_descriptor")
    # Renamed in Triton 3.7 (the old names raise there).
    _tma_load = getattr(gl_hopper.tma, "async_load", None) or gl_hopper.tma.async_copy_global_to_shared
    _tma_store = getattr(gl_hopper.tma, "async_store", None) or gl_hopper.tma.async_copy_shared_to_global
except ImportError:  # pragma: no cover
    HAVE_DEVICE_TMA = False

if HAVE_DEVICE_TMA:
    @gluon.jit
    def tma_copy(in_ptr, out_ptr, M: gl.constexpr, N: gl.constexpr):
        # jax-triton 0.4's gluon_test kernel: descriptors made on the device (global scratch).
        layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([M, N], gl.float32)
        in_desc = gl_hopper.tma.make_tensor_descriptor(in_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N],
                                                       layout=layout)
        out_desc = gl_hopper.tma.make_tensor_descriptor(out_ptr, shape=[M, N], strides=[N, 1], block_shape=[M, N],
                                                        layout=layout)
        smem = gl.allocate_shared_memory(gl.float32, [M, N], layout)
        bar = gl.allocate_shared_memory(gl.int64, [1], gl_hopper.mbarrier.MBarrierLayout())
        gl_hopper.mbarrier.init(bar, count=1)
        gl_hopper.mbarrier.expect(bar, M * N * 4)
        _tma_load(in_desc, [0, 0], bar, smem)
        gl_hopper.mbarrier.wait(bar, phase=0)
        gl_hopper.mbarrier.invalidate(bar)
        _tma_store(out_desc, [0, 0], smem)
        gl_hopper.tma.store_wait(0)
