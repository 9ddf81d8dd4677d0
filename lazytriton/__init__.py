"""lazytriton: lazy, first-call autotuning runtime for Triton kernels.

    import lazytriton
    add = lazytriton.kernel(add_kernel)       # nothing compiles here
    add[grid](x, y, out, n)                   # first call: compile + tune on x, y, out
    add[grid](x, y, out, n)                   # later calls: C++ stub -> cuLaunchKernelEx
"""
from __future__ import annotations

import os as _os
import sys as _sys

from .version import __version__


def _installed_elsewhere() -> str | None:
    """The directory of another lazytriton on sys.path with its C++ core built. From a clone's
    root, `python -m lazytriton` and `python -c "import lazytriton"` find the source tree first
    (the current directory leads sys.path), which has no core: the installed package has it."""
    import importlib.machinery

    here = _os.path.realpath(_os.path.dirname(__file__))
    for entry in _sys.path:
        there = _os.path.join(entry or _os.getcwd(), "lazytriton")
        if (_os.path.isfile(_os.path.join(there, "__init__.py")) and _os.path.realpath(there) != here
                and importlib.machinery.PathFinder.find_spec("lazytriton._core", [there]) is not None):
            return there
    return None


try:
    from . import _core
except ImportError as exc:
    _there = _installed_elsewhere()
    if _there is None:
        raise ImportError("lazytriton's C++ core is not built; install the package with `pip install .`") from exc
    # Hand over to the installed package: its modules, core and files are the ones imported from now on
    # (this __init__ is the clone's, the one README's `pip install .` installed there).
    __path__[:] = [_there]
    __file__ = _os.path.join(_there, "__init__.py")
    from . import _core


def _one_line_if_uncaught(error: BaseException) -> None:
    # A bad setting stops the program with its one line (the message names the variable, its value
    # and what it takes), not a traceback through the imports; a caller may still catch it.
    previous = _sys.excepthook

    def hook(kind, value, tb):
        if value is error:
            print(f"error: {value}", file=_sys.stderr)
        else:
            previous(kind, value, tb)

    _sys.excepthook = hook


from .settings import SettingError, check_environment  # noqa: E402

try:
    check_environment()
except SettingError as _bad:
    _one_line_if_uncaught(_bad)
    raise

from .runtime.kernel import LazyKernel, kernel, stats, stream_handle  # noqa: E402
from .model.tensor_desc import TensorDescriptor  # noqa: E402
from .runtime.tuner import TuneOptions  # noqa: E402
from .runtime.resolve import CaptureError  # noqa: E402

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
    from .settings import remote_cache_url

    if remote_cache_url() is not None:  # checked above, with every setting
        from .cache import get_cache

        get_cache().warm_up()


_connect_the_remote_cache()

__all__ = ["LazyKernel", "kernel", "stats", "stream_handle", "TensorDescriptor", "TuneOptions", "RuntimeFailure",
           "CaptureError", "gpu_available", "SettingError", "__version__"]
