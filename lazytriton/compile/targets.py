"""Compile targets and sources: which GPU a compile is for (a device's, or one
named by the user for AOT use), and Triton's source object for one
specialization. A leaf of lazytriton.compile: the compiler and the compile
server both use it."""
from __future__ import annotations

import re

from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .. import settings
from ..model.spec import is_gluon

DEFAULT_ARCH = 90  # target used to compile when no GPU is present (demo, tests)
# AMD targets lazytriton knows by name (AOT use, no device): wave64 CDNA, wave32 RDNA.
AMD_TARGETS = {"gfx90a": 64, "gfx942": 64, "gfx950": 64, "gfx1100": 32, "gfx1101": 32, "gfx1200": 32,
               "gfx1201": 32}


def target_for(arch: str | int) -> GPUTarget:
    """A compile target named by the user (AOT, no device): an NVIDIA compute
    capability (90, "90", "sm_90", "sm90") or an AMD architecture ("gfx942";
    "gfx942:sramecc+:xnack-" as HIP names it)."""
    text = str(arch).strip().lower()
    if text.startswith("gfx"):
        name = text.split(":")[0]
        if name not in AMD_TARGETS and not re.fullmatch(r"gfx\d{1,2}\d[0-9a-f]", name):  # gfx<major><minor><stepping>
            raise ValueError(f"unknown AMD target {arch!r} (e.g. {', '.join(sorted(AMD_TARGETS))})")
        return GPUTarget("hip", name, AMD_TARGETS.get(name, 64 if name.startswith("gfx9") else 32))
    digits = text.removeprefix("sm_").removeprefix("sm")
    if not digits.isdigit():
        raise ValueError(f"unknown target {arch!r}: an NVIDIA compute capability (90, 'sm_90') or an AMD "
                         f"architecture ({', '.join(sorted(AMD_TARGETS))})")
    return GPUTarget("cuda", int(digits), 32)


def default_target() -> GPUTarget:
    return target_for(settings.default_arch(DEFAULT_ARCH))


def device_target(dev: dict | tuple[int, int]) -> GPUTarget:
    """The target of a device (lazytriton._core.device_info's dict; a CUDA
    capability tuple as before): an AMD device's architecture name and wavefront size."""
    if isinstance(dev, dict):
        if dev.get("backend") == "hip":
            return GPUTarget("hip", dev["arch"], int(dev["warp_size"]))
        dev = dev["capability"]
    major, minor = dev
    return GPUTarget("cuda", major * 10 + minor, 32)


def target_label(target: GPUTarget) -> str:
    """"sm_90" or "gfx942", for messages."""
    return target.arch if target.backend == "hip" else f"sm_{target.arch}"


def ast_source(fn, signature: dict, constexprs: dict, attrs: dict):
    """Triton's source object for one specialization of `fn`. A Gluon kernel
    needs Gluon's own (GluonASTSource: its IR starts at TTGIR, with the module's
    warp and CTA counts set first), as GluonJITFunction.create_binder picks."""
    if is_gluon(fn):
        from triton.experimental.gluon._runtime import GluonASTSource
        return GluonASTSource(fn, signature, constexprs, attrs)
    return ASTSource(fn, signature, constexprs, attrs)
