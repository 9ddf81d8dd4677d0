"""Reading torch tensor arguments through torch's C++ API instead of its Python getters.

A launch reads three things of each tensor argument: its dtype, whether it is on the GPU, and its
data pointer. Through torch's Python getters (`t.dtype`, `t.is_cuda`, `t.data_ptr()`) that is most of
a torch launch's host cost beyond the driver's: 0.20 us a tensor, measured from C on an H200 host
(0.15 us calling the getters' descriptors directly); through torch's C++ API, 0.017 us. So a small module (csrc/python/torch_reader.cc) is compiled at
run time against the installed torch's own headers and libraries, once per torch build and toolchain
(runtime/native.py caches it on disk), and handed to the stubs (`_core.set_torch_reader`). Until it is
loaded, and for whatever it declines (a tensor subclass, an active torch function mode), the stubs
read tensors through the Python getters: the answers are the same.

It is requested by the first call that is resolved with a CUDA tensor among its arguments, so that a
process that never launches on torch tensors never compiles it, and it builds like a launch stub: in
the background (LAZYTRITON_STUB_BUILD=background, the default; loading a reader already on disk
happens there too, off the first call's path), before that call (=sync), or not at all (=off: no C++
compiler is run; a later first call under another setting may still build it)."""
from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from typing import Any

from .. import _core, paths
from .. import settings
from . import native

log = logging.getLogger("lazytriton.runtime.torch_reader")

_lock = threading.Lock()
_requested = False
_thread: threading.Thread | None = None


def request(args: tuple) -> None:
    """Starts loading the reader if `args` holds a CUDA torch tensor and no earlier call did."""
    global _requested, _thread
    if _requested or "torch" not in sys.modules or not _holds_cuda_tensor(args):
        return
    mode = settings.stub_build()
    if mode == "off":  # no compiler now; a later first call under another setting may build it
        return
    with _lock:
        if _requested:
            return
        _requested = True
        if mode == "sync":
            _load(background=False)
            return
        # Loaded (checked, and built if need be) off the first call's path even when it is on disk:
        # until then the getters serve, with the same answers.
        _thread = threading.Thread(target=_load, kwargs={"background": True}, name="lazytriton-torch-reader",
                                   daemon=True)
        _thread.start()


def wait(timeout: float | None = None) -> bool:
    """Waits for a load under way (tests, benchmarks); whether the reader is installed."""
    t = _thread
    if t is not None:
        t.join(timeout)
    return _core.torch_reader_installed()


def load() -> Any:
    """Builds (once) and installs the reader now; its module (tests)."""
    return _load(background=False)


def _holds_cuda_tensor(args: tuple) -> bool:
    import torch

    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)


def _load(background: bool):
    try:
        # outlive: a build of 15-30 s finishes even when the process that started it ends sooner.
        module = native.load_module(module_name(), _source, "the torch tensor reader", _flags(),
                                    background=background, outlive=True)
    except Exception as exc:  # the Python getters go on serving: slower, same answers
        if not native.exiting():
            log.warning("%s; torch tensors are read through torch's Python getters", exc)
        return None
    _core.set_torch_reader(module.reader)
    return module


def _torch_dir() -> str:
    import torch

    return os.path.dirname(torch.__file__)


def module_name() -> str:
    """One module per torch build and reader source (the toolchain is native's cache tag)."""
    import torch

    h = hashlib.sha256((paths.stub_source_dir() / "torch_reader.cc").read_bytes())
    for part in (torch.__version__, getattr(torch.version, "git_version", ""), _torch_dir(),
                 str(torch._C._GLIBCXX_USE_CXX11_ABI)):
        h.update(str(part).encode() + b"\0")
    return f"lt_torch_reader_{h.hexdigest()[:12]}"


def _source() -> str:
    name = module_name()
    return f'#define LT_MODULE_NAME "{name}"\n#define LT_INIT_FN PyInit_{name}\n#include "torch_reader.cc"\n'


def _flags() -> tuple[str, ...]:
    import torch

    base = _torch_dir()
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return (f"-std=c++{20 if version >= (2, 10) else 17}",  # torch's own extensions' standard
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-I{base}/include", f"-I{base}/include/torch/csrc/api/include", "-w",
            f"-L{base}/lib", "-lc10", "-ltorch_cpu", "-ltorch_python", f"-Wl,-rpath,{base}/lib")
