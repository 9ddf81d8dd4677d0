"""lazytriton: lazy, first-call autotuning runtime for Triton kernels.

    import lazytriton
    add = lazytriton.kernel(add_kernel)       # nothing compiles here
    add[grid](x, y, out, n)                   # first call: compile + tune on x, y, out
    add[grid](x, y, out, n)                   # later calls: C++ stub -> cuLaunchKernelEx
"""
from __future__ import annotations

try:
    from importlib.metadata import version as _version

    __version__ = _version("lazytriton")
except Exception:  # running from a source tree
    __version__ = "0+unknown"

try:
    from . import _core
except ImportError as exc:  # pragma: no cover - only from an unbuilt source tree
    raise ImportError("lazytriton's C++ core is not built; install the package with `pip install .`") from exc

from .runtime.kernel import LazyKernel, kernel, stats, stream_handle  # noqa: E402
from .model.tensor_desc import TensorDescriptor  # noqa: E402
from .runtime.tuner import TuneOptions  # noqa: E402

RuntimeFailure = _core.RuntimeFailure
RuntimeFailure.__doc__ = """An error of lazytriton's C++ runtime (a RuntimeError): no usable CUDA (or HIP)
driver or device; a driver call that failed, named with the driver's error name
(CUDA_ERROR_...); a kernel that cannot be loaded or launched on this device (shared
memory, grid); a tuning trial that failed on the call's buffers (nothing is persisted
then). The message names the kernel where there is one. A failed first call is not
remembered: the next call with the same arguments tries again."""


def gpu_available() -> tuple[bool, str]:
    """(True, "") if a CUDA driver and device are usable, else (False, reason)."""
    return _core.driver_status()


def _connect_the_remote_cache() -> None:
    # With LAZYTRITON_REMOTE_CACHE set, the client is imported and connected now, on a thread:
    # importing Redis' client takes 0.2-0.4 s, which a first call found in Redis would
    # otherwise wait for (a program imports lazytriton well before its first call).
    from .settings import SettingError, remote_cache_url

    try:
        if remote_cache_url() is None:
            return
        from .cache import get_cache

        get_cache().warm_up()
    except SettingError:
        pass  # said, naming the setting, by the first call that reads it


_connect_the_remote_cache()

__all__ = ["LazyKernel", "kernel", "stats", "stream_handle", "TensorDescriptor", "TuneOptions", "RuntimeFailure",
           "gpu_available", "__version__"]
