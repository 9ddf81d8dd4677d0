"""The field corpus's upstream modules, imported from the installed packages
(never copied here): TransformerEngine's Triton permutation kernels and their
PyTorch wrappers, Liger-Kernel's ops, flash-linear-attention's (fla-core) ops.

`pip install -e .[field]` (or the three pinned packages of pyproject's `field`
extra) installs them. Each loader raises `Missing` (a pytest skip) naming the
package when it is absent, so the corpus skips cleanly.

TransformerEngine: `import transformer_engine` runs its package `__init__`,
which looks for the compiled core library (transformer-engine-cu12/cu13) and
refuses to import without it. The Triton kernels and their PyTorch wrappers
are plain Python modules that need none of it, so this loads them
(`te_kernels()`, `te_wrappers()`) from the installed package directory
with placeholder parent packages (module objects with the right `__path__`
and no `__init__` code run), then takes the placeholders out of `sys.modules`
again: the process keeps only the loaded modules. Where other installed packages
probe for TransformerEngine and import it whole when they find it (peft does, and
fails on the pure-Python wheel alone), install TE's wheel into a directory of its
own (`pip install --no-deps --target DIR transformer-engine==2.20.2`) and set
LAZYTRITON_FIELD_TE_DIR=DIR: the corpus then loads its modules from there only.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from functools import lru_cache
from pathlib import Path

import pytest

# The versions pyproject's `field` extra pins (the corpus was written against them).
VERSIONS = {"transformer_engine": "2.20.2", "liger_kernel": "0.8.5", "fla": "0.6.0"}
DISTRIBUTIONS = {"transformer_engine": "transformer-engine", "liger_kernel": "liger-kernel", "fla": "fla-core"}


class Missing(pytest.skip.Exception):
    """An upstream package of the corpus is not installed (a pytest skip)."""


def _need(top: str) -> Path:
    spec = importlib.util.find_spec(top)  # does not run the package's __init__
    te_dir = os.environ.get("LAZYTRITON_FIELD_TE_DIR")
    if spec is None and top == "transformer_engine" and te_dir and (Path(te_dir) / top).is_dir():
        # TE's wheel kept off sys.path: packages that probe for TE (peft) import it whole when they
        # find it, and its __init__ refuses to import without the compiled core library.
        return Path(te_dir) / top
    if spec is None or not spec.submodule_search_locations:
        raise Missing(f"{DISTRIBUTIONS[top]} is not installed: pip install '{DISTRIBUTIONS[top]}=="
                      f"{VERSIONS[top]}' (or lazytriton's [field] extra) to run the field corpus", allow_module_level=True)
    return Path(list(spec.submodule_search_locations)[0])


def installed_version(top: str) -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(DISTRIBUTIONS[top])
    except PackageNotFoundError:
        return "unknown"


def _te_module(leaf: str) -> types.ModuleType:
    root = _need("transformer_engine")
    if leaf in sys.modules:  # imported already (the ordinary way, where TE's core library is installed)
        return sys.modules[leaf]
    parents = [".".join(leaf.split(".")[:i]) for i in range(1, leaf.count(".") + 1)]
    added = []
    try:
        for name in parents:
            if name not in sys.modules:
                pkg = types.ModuleType(name)
                pkg.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
                pkg.__package__ = name
                sys.modules[name] = pkg
                added.append(name)
        return importlib.import_module(leaf)
    finally:
        # The loaded modules stay registered under their own names (Triton's tooling may look a kernel's
        # module up); no placeholder stays behind to shadow a real `import transformer_engine`.
        for name in added:
            sys.modules.pop(name, None)


@lru_cache(maxsize=None)
def te_kernels() -> types.ModuleType:
    """transformer_engine.common.triton.permutation: the Triton kernels (needs triton, packaging; no torch)."""
    return _te_module("transformer_engine.common.triton.permutation")


@lru_cache(maxsize=None)
def te_wrappers() -> types.ModuleType:
    """transformer_engine.pytorch.triton.permutation: their PyTorch wrappers (make_row_id_map,
    permute_with_mask_map, unpermute_with_mask_map, ...), which import the kernels into their own globals."""
    te_kernels()
    return _te_module("transformer_engine.pytorch.triton.permutation")


@lru_cache(maxsize=None)
def liger(op: str) -> types.ModuleType:
    """liger_kernel.ops.<op> (rms_norm, layer_norm, swiglu, cross_entropy, rope)."""
    _need("liger_kernel")
    return importlib.import_module(f"liger_kernel.ops.{op}")


@lru_cache(maxsize=None)
def fla(module: str) -> types.ModuleType:
    """fla.<module> (ops.common.fused_recurrent, modules.norm.l2norm)."""
    _need("fla")
    try:
        importlib.import_module("einops")
    except ImportError:
        raise Missing("fla-core needs einops: pip install einops", allow_module_level=True) from None
    return importlib.import_module(f"fla.{module}")


# Every upstream kernel of the corpus: (project, module loader, attribute). The GPU tests patch
# these attributes with lazytriton.kernel(original) in the module the wrapper looks them up in.
KERNELS = {
    "te._row_id_map_pass_1_kernel": ("transformer_engine", te_kernels, "_row_id_map_pass_1_kernel"),
    "te._row_id_map_pass_2_kernel": ("transformer_engine", te_kernels, "_row_id_map_pass_2_kernel"),
    "te._row_id_map_pass_3_kernel": ("transformer_engine", te_kernels, "_row_id_map_pass_3_kernel"),
    "te._permute_kernel": ("transformer_engine", te_kernels, "_permute_kernel"),
    "te._unpermute_kernel": ("transformer_engine", te_kernels, "_unpermute_kernel"),
    "liger._rms_norm_forward_kernel": ("liger_kernel", lambda: liger("rms_norm"), "_rms_norm_forward_kernel"),
    "liger._block_rms_norm_forward_kernel": ("liger_kernel", lambda: liger("rms_norm"),
                                             "_block_rms_norm_forward_kernel"),
    "liger._layer_norm_forward_kernel": ("liger_kernel", lambda: liger("layer_norm"), "_layer_norm_forward_kernel"),
    "liger._swiglu_forward_kernel": ("liger_kernel", lambda: liger("swiglu"), "_swiglu_forward_kernel"),
    "liger.liger_cross_entropy_kernel": ("liger_kernel", lambda: liger("cross_entropy"),
                                         "liger_cross_entropy_kernel"),
    "liger._triton_rope": ("liger_kernel", lambda: liger("rope"), "_triton_rope"),
    "fla.fused_recurrent_fwd_kernel": ("fla", lambda: fla("ops.common.fused_recurrent"),
                                       "fused_recurrent_fwd_kernel"),
    "fla.l2norm_fwd_kernel": ("fla", lambda: fla("modules.norm.l2norm"), "l2norm_fwd_kernel"),
    "fla.l2norm_fwd_kernel_row": ("fla", lambda: fla("modules.norm.l2norm"), "l2norm_fwd_kernel_row"),
}


def kernel(key: str):
    """The upstream kernel object (a JITFunction, Autotuner or Heuristics) of KERNELS[key]."""
    _, load, attr = KERNELS[key]
    return getattr(load(), attr)
