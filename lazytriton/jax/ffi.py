"""The XLA FFI handler: built on first use against the installed jaxlib's FFI
headers, registered with JAX for CUDA, and the Python side of its slow path
(resolving a call site on its first execution)."""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import logging
import os
import threading
from typing import Any

from .. import _core, paths
from ..cache import keys
from ..runtime import fixed, native
from ..model import tensor_desc
from ..model.arrays import DeviceArray
from ..model.specialize import WIDE_FLOAT, needs_fp64
from .. import settings

log = logging.getLogger("lazytriton.jax")

TARGET = "lazytriton_triton_call"
PAYLOAD_VERSION = 6  # the call-site payload lazytriton.jax writes (v3: aliased inputs point at their
# output buffer, @triton.jit values as {"$jit": ...}, a cost_estimate_json attribute; v4: heuristic values
# per config, evaluated at trace time; v5: tuple arguments: "args" has one entry per leaf (a tuple
# argument's elements, depth first) with its "name" ("xs[1][0]"), "layout" per call parameter the index
# of its entry or, for a tuple, nested lists of its elements' indices; v6: host TMA descriptor arguments
# ("desc": shape, strides, block, padding, tf32 on a buffer) and per config the block shapes its pre_hook
# set ("blocks"))
STATE_TYPE = "lazytriton_site"

_lock = threading.Lock()
_module = None
_registered = False


_handler_info: dict = {}  # how the handler became ready: "how", "seconds", "ready_at" (perf_counter)


def handler_module():
    """The handler module: the one prebuilt at install time for the jaxlib in
    use, else built (first time on this toolchain) or loaded from the cache."""
    global _module
    if _module is None:
        import time

        import jax
        import jaxlib

        t0 = time.perf_counter()
        name = "lt_jax_ffi"
        src = paths.jax_handler_source().read_text()
        # LAZYTRITON_PREBUILT_HANDLER=0: ignore the prebuilt one (as a wheel built in isolation has none).
        use_prebuilt = settings.prebuilt_handler()
        _module, how = (_prebuilt_handler(name, src, jaxlib.__version__) if use_prebuilt else None), "prebuilt"
        if _module is None:
            tag = "-jax" + hashlib.sha256((src + jaxlib.__version__).encode()).hexdigest()[:8]
            built = native.is_built(name, tag)
            _module = native.load_module(name, lambda: src, "the XLA FFI handler",
                                          extra_flags=(f"-I{jax.ffi.include_dir()}", f"-DLT_MODULE_NAME={name}"),
                                          tag=tag)
            how = "cached" if built else "built"
        now = time.perf_counter()
        _handler_info.update(how=how, seconds=now - t0, ready_at=now)
        log.debug("XLA FFI handler %s in %.2fs", how, now - t0)
    return _module


def _prebuilt_handler(name: str, src: str, jaxlib_version: str):
    """The handler built with the package (CMakeLists.txt), if it was built
    against this jaxlib and this source; else None."""
    lib = paths.runtime_library().parent
    try:
        info = json.loads((lib / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    if info.get("jaxlib") != jaxlib_version or info.get("source_sha256") != hashlib.sha256(src.encode()).hexdigest():
        log.debug("the prebuilt XLA FFI handler is for jaxlib %s (%s installed): building one", info.get("jaxlib"),
                  jaxlib_version)
        return None
    import sysconfig

    so = lib / f"{name}{sysconfig.get_config_var('EXT_SUFFIX')}"
    if not so.exists():
        return None
    return native.load_prebuilt(name, so)


def handler_info() -> dict:
    """How the handler became ready in this process (prebuilt, cached, built),
    how long that took and when (time.perf_counter()); empty before. For benchmarks."""
    return dict(_handler_info)


def prepare_in_background() -> None:
    """Where JAX has a CUDA plugin (checked without starting a backend), gets
    a first execution's slow path under way when lazytriton.jax is imported:
    the compile server starts warming up, and the handler is built (or
    loaded) on a daemon thread, so that neither waits on the critical path."""
    import importlib.util

    def installed(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is not None
        except ImportError:
            return False

    if not any(installed(p) for p in _CUDA_PLUGINS):
        return
    from ..compile import compiler

    compiler.warm_up()  # idempotent; a Site's LazyKernel is made only at first execution
    if _module is not None:
        return

    def build():
        try:
            handler_module()
        except Exception as exc:  # noqa: BLE001  (the first execution builds again and raises)
            log.debug("building the XLA FFI handler in the background failed: %s", exc)

    threading.Thread(target=build, name="lazytriton-ffi-build", daemon=True).start()


_CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12",
                 # ROCm: the same handler, over lazytriton's HIP driver layer
                 "jax_rocm10_plugin", "jax_rocm7_plugin", "jax_rocm60_plugin", "jax_plugins.xla_rocm10",
                 "jax_plugins.xla_rocm7", "jax_plugins.xla_rocm60")
# XLA's names of the GPU platforms the handler serves (one build: the driver is chosen at run time).
PLATFORMS = ("CUDA", "ROCM")
_cuda = None


def cuda_present() -> bool:
    """Whether JAX has a GPU backend in this process (CUDA or ROCm)."""
    global _cuda
    if not _cuda:
        import jax

        _cuda = False
        for platform in ("cuda", "rocm"):
            try:
                _cuda = _cuda or bool(jax.devices(platform))
            except RuntimeError:
                pass
    return _cuda


def ensure_registered() -> None:
    """Registers the handler for CUDA and ROCm once per process (XLA keeps the
    registration of a platform this process has no backend for unused)."""
    global _registered
    if _registered:
        return
    import jax

    with _lock:
        if _registered:
            return
        mod = handler_module()
        mod.set_resolver(_resolve)
        for platform in PLATFORMS:
            jax.ffi.register_ffi_type(STATE_TYPE, mod.state_type(), platform=platform)
            jax.ffi.register_ffi_target(TARGET, mod.handlers(), platform=platform, api_version=1)
        _registered = True


# -- the slow path: called from C++ (GIL taken there) on a site's first execution ----

_sites: dict[str, "Site"] = {}
_kernels: dict[str, Any] = {}  # kernel identity -> the Triton kernel object (filled at trace time)


def register_kernel(identity: str, kernel: Any) -> str:
    """The id under which this process resolves `kernel`'s call sites:
    `identity` (module, qualname, source fingerprint), suffixed when another
    kernel object already holds it. Two autotune wrappers of one function
    (other prune hooks, reset_to_zero, key) share an identity but must not
    share a call site; a fresh process imports the kernel by name either way."""
    key, n = identity, 1
    while (held := _kernels.get(key)) is not None and held is not kernel:
        n += 1
        key = f"{identity}#{n}"
    _kernels[key] = kernel
    return key


def _resolve(payload: str, buffers: tuple, stream: int, device: int, capturing: bool) -> int:
    site = _sites.get(payload)
    if site is None:
        site = _sites.setdefault(payload, Site(json.loads(payload)))
    return site.resolve(buffers, stream, device, capturing).share()


# Stand-in buffer addresses for compiling ahead: XLA's buffers are at least 256-byte aligned, which
# is what the compile sees (Triton's divisibility by 16); a site whose real buffers are not gets
# its own compile at its first execution.
_AHEAD_BASE, _AHEAD_STRIDE = 0x7F0000000000, 1 << 36


def compile_ahead(payload: str, nbytes: list[int]) -> None:
    """When a program is lowered on a GPU machine, starts compiling its call
    site's candidates in the background (LazyKernel.compile_ahead), so that a
    program of many kernels pays about its slowest compile on its first step,
    not the sum of them. `nbytes`: each buffer's size (inputs, then outputs).
    Failures are left to the first execution, which compiles and reports."""
    if not settings.compile_ahead() or not cuda_present():
        return
    from .. import distributed

    if distributed.agreement() is not None:  # one process of the job compiles and tunes; the others receive
        return

    def run():
        try:
            site = _sites.get(payload)
            if site is None:
                site = _sites.setdefault(payload, Site(json.loads(payload)))
            buffers = tuple((_AHEAD_BASE + i * _AHEAD_STRIDE, n) for i, n in enumerate(nbytes))
            pos, kw = site.lazy.as_call(site.call_args(buffers), site.options)
            f = site.lazy.compile_ahead(*pos, soon=True, **kw)  # the program's execution waits for every site
            _ahead_futures.add(f)
            f.add_done_callback(_ahead_futures.discard)
        except Exception as exc:  # noqa: BLE001  (the first execution resolves again and raises)
            log.debug("%s: compiling ahead failed: %s", payload[:80], exc)

    _lowered().submit(run)


_ahead_futures: set = set()  # the sites' compiles made ahead and not done yet


def compiled_ahead(timeout: float | None = None) -> None:
    """Waits until every call site lowered so far in this process is compiled ahead (or has
    failed to: its first execution then compiles and reports). For a program that must not
    share its cores with background compiles from some point on (a benchmark, a fork)."""
    _lowered().submit(lambda: None).result(timeout)  # one thread takes the sites in order: all asked
    cf.wait(_ahead_futures.copy(), timeout)


_lowering_queue = None


def _lowered():
    """One thread sets the sites up (their Site, their arguments) in the order they were lowered,
    off the lowering; each site's compiles then queue `soon`, in the one place a program's sites
    share in the compile queue (XLA decides the order they run in: the costliest first)."""
    global _lowering_queue
    if _lowering_queue is None:
        _lowering_queue = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lazytriton-compile-ahead-site")
    return _lowering_queue


def _after_fork() -> None:  # a forked child has no thread of its parent's: it starts its own
    global _lowering_queue
    _lowering_queue = None
    _ahead_futures.clear()


os.register_at_fork(after_in_child=_after_fork)


class Site:
    """One triton_call site, rebuilt from its payload (so a process that
    loaded the executable from JAX's persistent cache can resolve it too)."""

    def __init__(self, d: dict):
        from ..runtime.kernel import LazyKernel
        from ..model.spec import kernel_spec

        self.d = d
        self.name = d["name"]
        if d.get("v") != PAYLOAD_VERSION:
            raise RuntimeError(f"{self.name}: this executable was lowered by another lazytriton version "
                               f"(payload v{d.get('v')}, this one reads v{PAYLOAD_VERSION}); re-trace the "
                               "function (or clear JAX's persistent compilation cache)")
        kernel = _kernels.get(d["kernel"]["id"]) or _import_kernel(d["kernel"])
        if keys.kernel_fingerprint(kernel_spec(kernel).fn) != d["kernel"]["fingerprint"]:
            raise RuntimeError(f"{self.name}: kernel {d['kernel']['name']} changed since this executable "
                               "was lowered; re-trace the function")
        # Callable constexprs (@triton.jit functions) travel by name: resolve them once.
        for a in d["args"]:
            if "scalar" in a:
                a["scalar"] = _decode(a["scalar"])
        for c in d["configs"]:
            c["kwargs"] = {k: _decode(v) for k, v in c["kwargs"].items()}
            if "heuristics" in c:
                c["heuristics"] = {k: _decode(v) for k, v in c["heuristics"].items()}
        self.lazy = _site_kernel(kernel, d, LazyKernel)
        # Options a Config carries went into each config (an untuned kernel's into its one config
        # when its heuristics were frozen); the others (launch_pdl, debug, ...) are the call's.
        self.options = ({k: v for k, v in d["options"].items() if k not in _CONFIG_FIELDS}
                        if self.lazy.spec.autotuned else d["options"])
        self._said = False

    def call_leaves(self, buffers: tuple) -> list:
        """One value per entry of the payload's "args" (a leaf): an array,
        a host TMA descriptor on a buffer, or a scalar. `buffers`: (address,
        bytes) of each buffer."""
        leaves = []
        for a in self.d["args"]:
            if "buffer" in a:
                ptr, nbytes = buffers[a["buffer"]]
                base = DeviceArray(ptr, a["dtype"], nbytes, tuple(a["shape"]))
                if "desc" in a:  # a host TMA descriptor on this buffer: the launch path checks it
                    dd = a["desc"]
                    base = tensor_desc.unchecked(base, dd["shape"], dd["strides"], dd["block"], dd["padding"],
                                                 dd["tf32"])
                leaves.append(base)
            else:
                leaves.append(a["scalar"])
        return leaves

    def call_args(self, buffers: tuple, leaves: list | None = None) -> list:
        """One value per call parameter, positionally (a tuple argument rebuilt
        from its leaves): exactly what the C++ launches pass, so tuning trials
        and replays see the same call."""
        leaves = self.call_leaves(buffers) if leaves is None else leaves

        def nest(item):  # a tuple argument rebuilt from its leaves (lazytriton.model.tuples)
            return tuple(nest(x) for x in item) if isinstance(item, list) else leaves[item]

        return [nest(item) for item in self.d["layout"]]

    def resolve(self, buffers: tuple, stream: int, device: int, capturing: bool):
        d = self.d
        leaves = self.call_leaves(buffers)
        args = self.call_args(buffers, leaves)
        pos, kw = self.lazy.as_call(args, self.options)
        mode = "tune"
        if capturing:
            mode = "first" if settings.capture_fallback() == "first_config" else "record"
        if not self._said:  # once: a kernel tuned online resolves every execution until its winner is fixed
            self._said = True
            log.info("%s: resolving on its first execution (%s)", self.name,
                     "stream capturing" if capturing else "tuning allowed")
        if capturing:
            # Compiling and loading a module are host work, not stream work, but a
            # capture in thread-local mode (XLA's) refuses them unless relaxed.
            previous = _core.exchange_capture_mode(_core.CAPTURE_MODE_RELAXED)
            try:
                res = self.lazy.resolve(*pos, grid=self._grid, stream=stream, mode=mode, per_call=True, **kw)
            finally:
                _core.exchange_capture_mode(previous)
        else:
            res = self.lazy.resolve(*pos, grid=self._grid, stream=stream, mode=mode, per_call=True, **kw)
        if len(res.types) != len(d["args"]):
            raise RuntimeError(f"{self.name}: internal error: the kernel was resolved for {len(res.types)} "
                               f"arguments but the call site has {len(d['args'])}")
        cfg = self._config_of(res.meta)
        # Per kernel parameter, read from the call's slot table rows as the stubs read them: a
        # buffer, a descriptor on one (encoded at every execution), or a scalar packed once.
        sources = fixed.param_sources(self.name, res.table, res.entry.is_param, res.leaf_names, leaves,
                                      lambda i: d["args"][i]["buffer"])
        n_in = d["n_inputs"]
        zero = [(n_in + o, buffers[n_in + o][1]) for o in cfg["zeroed"]]
        # Online tuning, still deciding: a candidate for this execution only (timed unless it is the
        # first execution's, or one under capture); the call site asks again on the next.
        return _core.Entry(res.entry.kernel, list(res.entry.is_param), res.meta, res.grid, sources, zero,
                           timer=res.timer, once=res.this_call_only)

    def _config_of(self, meta: dict) -> dict:
        for cfg in self.d["configs"]:
            if all(meta.get(k) == v for k, v in cfg["kwargs"].items()):
                return cfg
        raise RuntimeError(f"{self.name}: the winner's meta-parameters {meta} match no config of the call site")

    def _grid(self, meta: dict):
        return tuple(self._config_of(meta)["grid"])


def _site_kernel(kernel: Any, d: dict, LazyKernel):
    """A LazyKernel for this site: its configs as the call site pruned them,
    zeroed outputs zeroed before every trial, fresh outputs never saved."""
    import dataclasses

    import triton

    from ..model import pre_hooks
    from ..model.spec import kernel_spec

    spec = kernel_spec(kernel)
    # Heuristics were evaluated at trace time (they chose the grid): their values
    # become part of each config, so the compile uses exactly those values.
    # An untuned kernel whose options a Config cannot carry keeps evaluating them.
    frozen = bool(spec.heuristics) and (bool(spec.configs) or set(d["options"]) <= set(_CONFIG_FIELDS))
    if spec.configs or frozen:
        configs = []
        for c in d["configs"]:
            fields = {**(d["options"] if not spec.configs else {}), **{k: c[k] for k in _CONFIG_FIELDS if k in c}}
            # The block shapes the config's pre_hook set at trace time, replayed (pre_hooks.SetBlocks).
            hook = pre_hooks.SetBlocks(c["blocks"]) if c.get("blocks") else None
            configs.append(triton.Config({**c["kwargs"], **(c.get("heuristics", {}) if frozen else {})},
                                         **{k: v for k, v in fields.items() if v is not None}, pre_hook=hook))
        spec = dataclasses.replace(spec, configs=configs, heuristics=[] if frozen else spec.heuristics)
    # jax-triton passes a float that fp32 cannot hold as fp64: the site's
    # parameter gets that type, as if annotated (the binder and stubs follow).
    wide = {a["name"] for a in d["args"] if "scalar" in a and needs_fp64(a["scalar"])}
    if wide:
        spec = dataclasses.replace(spec, params=[dataclasses.replace(p, annotation=WIDE_FLOAT)
                                                 if p.name in wide and not p.annotation else p for p in spec.params])
    n_in = d["n_inputs"]
    # By leaf name: a tuple element is "xs[0]" (what tuning names its buffer by).
    out_names = {a["buffer"] - n_in: a["name"] for a in d["args"] if a.get("buffer", -1) >= n_in}
    zeroed = {out_names[o] for c in d["configs"] for o in c["zeroed"]}
    spec = dataclasses.replace(spec, reset_to_zero=sorted(set(spec.reset_to_zero) | zeroed))
    lk = LazyKernel(spec)
    aliased = {o for _, o in d["aliases"]}
    lk.scratch_args = frozenset(n for o, n in out_names.items() if o not in aliased) - set(spec.restore_value)
    return lk


_CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def _decode(v: Any) -> Any:
    if isinstance(v, dict) and "$jit" in v:
        ref = v["$jit"]
        fn = _kernels.get(ref["id"]) or _import_kernel(ref)
        if keys.kernel_fingerprint(fn) != ref["fingerprint"]:
            raise RuntimeError(f"@triton.jit function {ref['name']} (a constexpr value) changed since this "
                               "executable was lowered; re-trace the function")
        return fn
    return v


def _import_kernel(ident: dict) -> Any:
    import importlib

    where = f"{ident['module']}.{ident['qualname']}"
    if "<locals>" in ident["qualname"]:
        raise RuntimeError(
            f"kernel {ident['name']}: this executable was not traced in this process and the kernel ({where}) "
            "is local to a function, so it cannot be imported; define it at module level or trace the function "
            "once in this process")
    try:
        obj = importlib.import_module(ident["module"])
        for part in ident["qualname"].split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise RuntimeError(f"kernel {ident['name']}: cannot import {where} to resolve this executable ({exc})") from exc
    return obj


def handler_stats() -> dict:
    """Call sites the handler has seen, launches resolved, executions of the
    handler (a command buffer replay executes no handler), and declared
    input/output aliases that XLA did not share, so that the handler copied
    the input into the output first."""
    if _module is None:
        return {"sites": 0, "resolved": 0, "executes": 0, "alias_copies": 0}
    sites, resolved, executes, copies = _module.site_count()
    return {"sites": sites, "resolved": resolved, "executes": executes, "alias_copies": copies}
