"""Where lazytriton's installed pieces and its cache live."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def _installed_dir() -> Path:
    """Where the build installed the compiled core, its library, headers and sources: the
    package's directory, except under an editable install (`pip install -e`), where the
    Python files stay in the source tree and the built pieces are installed elsewhere."""
    spec = importlib.util.find_spec("lazytriton._core")
    if spec is not None and spec.origin:
        return Path(spec.origin).resolve().parent
    return Path(__file__).resolve().parent


_PKG = _installed_dir()


def include_dir() -> Path:
    """The C++ headers (lazytriton/*.h), for stubs and embedders."""
    return _PKG / "include"


def runtime_library() -> Path:
    """The shared C++ runtime library the stubs, the FFI handler and embedders link."""
    return _PKG / "lib" / "liblazytriton.so"


def stub_source_dir() -> Path:
    """Sources built at run time: the headers the generated stubs include
    (array_reads.h, python_args.h, stub_protocol.h: they need Python, so they are
    not public headers), the torch tensor reader and the FFI handler."""
    return _PKG / "src"


def jax_handler_source() -> Path:
    """Source of the XLA FFI handler, built on first use against the jaxlib in use."""
    return stub_source_dir() / "ffi_handler.cc"


def cmake_dir() -> Path:
    """Directory holding lazytritonConfig.cmake (for find_package)."""
    return _PKG / "lib" / "cmake" / "lazytriton"


def cache_root() -> Path:
    from .settings import default_cache_dir  # the one reader of LAZYTRITON_CACHE_DIR

    return default_cache_dir()
