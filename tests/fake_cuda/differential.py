"""Differential test against Triton's own binder and launcher, run by
tests/test_differential.py in a process whose libcuda.so.1 is fake_cuda.c.

For each kernel of tests/kernels/differential_kernels.py it makes seeded random
*sequences* of calls on ONE kernel object, varying what Triton specializes on
(None or an array, None or an int, ints near 1 / 16 / 2**31 / 2**63, bools,
floats, dtypes, alignment, tuples, descriptor block shapes) and the keywords
library code passes beside the arguments (launch options: num_warps,
num_stages, num_ctas, maxnreg, launch_pdl, launch_cooperative_grid; values a
triton.heuristics sets, which it overwrites; now and then a meta-parameter an
autotune config sets), and after every call compares what lazytriton handed the
driver with what Triton's own `JITFunction.run` (its binder, compiler and
launcher, unmodified) hands it for the same call: the compiled image launched
(so the specialization: signature, constexprs, attrs, options), grid, block,
shared memory, launch attributes (PDL, cooperative, cluster) and every
parameter's bytes (sizes read from the cubin by the fake driver). Whether
Triton takes a call at all is what its own `kernel[grid](...)` does
(Heuristics.run, Autotuner.run: "Conflicting meta-parameters", a keyword given
twice); both must take, or both refuse, the same calls. An autotuned kernel's
every launch (trials included) must be Triton's launch of one of its configs,
and one specialization always the same config.

Faces: "generic" (the table-driven stub only: LAZYTRITON_STUB_BUILD=off),
"generated" (the generated stubs, built before their first call), and "jax"
(lazytriton.jax call sites lowered for CUDA on this CPU, resolved as the XLA
handler resolves them and launched by the handler's C++ from buffer
addresses), "bundle" (C++ bundles: each call written by Bundle.add, then
launched by bundle_calls.cc from the bundle as a C++ program would). Every face reports when lazytriton refuses a call Triton takes,
or the reverse.

Usage: differential.py OUT.json [--calls N] [--seed S] [--faces generic,generated,jax,bundle]
(N: calls per kernel and face; the JAX and bundle faces run N // 8). The bundle face
needs $FAKE_CUDA_BUNDLE_CALLS_EXE, bundle_calls.cc built against the installed package.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia import driver as nvd  # noqa: E402
from triton.runtime.autotuner import Autotuner, Heuristics  # noqa: E402

import lazytriton  # noqa: E402
from kernels import differential_kernels as dk  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
LOG = os.environ["FAKE_CUDA_LOG"]
BASE = 0x7F0000000000


# -- arrays both sides read -----------------------------------------------------------------------

class Dtype:
    """A dtype as Triton's specializer and launcher read a torch dtype (str() ends in
    its name, itemsize), and as lazytriton reads one (its name)."""

    def __init__(self, name: str, itemsize: int):
        self.name, self.itemsize = name, itemsize
        self.is_floating_point = name.startswith(("float", "bfloat"))

    def __str__(self):
        return f"torch.{self.name}"

    __repr__ = __str__


DTYPES = {"fp16": Dtype("float16", 2), "bf16": Dtype("bfloat16", 2), "fp32": Dtype("float32", 4),
          "i32": Dtype("int32", 4), "i64": Dtype("int64", 8)}


class Buffer:
    """A device buffer known by address: data_ptr() and dtype, as a torch tensor
    presents itself to Triton (and to lazytriton)."""

    def __init__(self, ptr: int, dtype: str, nbytes: int = 1 << 20):
        self.ptr, self.dtype, self.nbytes, self.tdtype = ptr, DTYPES[dtype], nbytes, dtype

    def data_ptr(self) -> int:
        return self.ptr

    def __repr__(self):
        return f"Buffer(0x{self.ptr:x}, {self.tdtype})"


# -- the reference: Triton's own JITFunction.run on the fake driver ------------------------------

class FakeDeviceDriver:
    """What JITFunction.run asks its driver, for the fake device: the rest
    (loading cubins, launching) is Triton's own code on the fake libcuda.so.1."""

    def __init__(self):
        self.utils = nvd.CudaUtils()
        self.launcher_cls = nvd.CudaLauncher

    def is_active(self):
        return True

    def get_current_device(self):
        return 0

    def set_current_device(self, device):
        pass

    def get_current_stream(self, device=None):
        return current_stream()

    def get_current_target(self):
        return TARGET



# The stream a call that names none launches on. Triton's driver asks torch for its current stream;
# here torch's getters answer a side stream, as under `with torch.cuda.stream(s)`, and lazytriton's
# calls name no stream: it must pick the same one (its rule reads torch._C's getters per call).
SIDE_STREAM = 0x5E1DE0
_side_stream = False


def use_side_stream() -> None:
    global _side_stream
    try:
        import torch
    except ImportError:  # no torch: both sides launch on stream 0
        return
    torch._C._cuda_getCurrentRawStream = lambda device: SIDE_STREAM
    torch._C._cuda_getDevice = lambda: 0
    _side_stream = True


def current_stream() -> int:
    return SIDE_STREAM if _side_stream else 0


def records() -> list[dict]:
    if not os.path.exists(LOG):
        return []
    with open(LOG) as f:
        out = [json.loads(line) for line in f]
    os.remove(LOG)
    return out


def _bench_once(kernel_call, quantiles=None, **_):
    """The autotuner's benchmarker here: each config's launch once (Triton's own call), no timing."""
    kernel_call()
    return [1.0, 1.0, 1.0]


def triton_takes(kernel, args: tuple, kwargs: dict, grid) -> None:
    """Raises what Triton raises for this call: its own kernel[grid](*args, **kwargs),
    through Heuristics.run and Autotuner.run (their checks: a keyword a config sets too,
    one given twice), on the fake driver. Its launches are dropped (triton_runs makes them)."""
    k = kernel
    while not isinstance(k, triton.runtime.JITFunction):
        if isinstance(k, Autotuner):
            k.__dict__["do_bench"] = _bench_once  # Triton 3.9's cached property; earlier: its attribute
            k._do_bench = _bench_once
        k = k.fn
    try:
        kernel[grid](*args, **dict(kwargs))
    finally:
        records()


def triton_runs(kernel, args: tuple, kwargs: dict, grid, top: bool = True) -> list[tuple[dict, dict]]:
    """Per config, in Triton's order after its own pruning: (Triton's launch record,
    its specialization). Autotuner and Heuristics are walked with their own code
    (prune_configs, the heuristic functions); the launch is JITFunction.run's. Raises
    what Triton raises for the call (triton_takes)."""
    if top:
        triton_takes(kernel, args, kwargs, grid)
    if isinstance(kernel, Heuristics):
        named = dict(zip(kernel.arg_names, args))
        for v, heur in kernel.values.items():
            kwargs = {**kwargs, v: heur({**named, **kwargs})}
        return triton_runs(kernel.fn, args, kwargs, grid, top=False)
    if isinstance(kernel, Autotuner):
        kernel.nargs = dict(zip(kernel.arg_names, args))
        try:
            configs = kernel.prune_configs(dict(kwargs))
        finally:
            kernel.nargs = None
        out = []
        for config in configs:
            opts = {k: v for k, v in (("num_warps", config.num_warps), ("num_stages", config.num_stages),
                                      ("num_ctas", config.num_ctas)) if v is not None}
            out += triton_runs(kernel.fn, args, {**kwargs, **config.all_kwargs(), **opts}, grid, top=False)
        return out
    compiled = kernel.run(*args, grid=grid, warmup=False, **kwargs)
    (rec,) = records()
    src = compiled.src
    spec = {"signature": {str(k): str(v) for k, v in src.signature.items()},
            "constexprs": {str(k): repr(v) for k, v in src.constants.items()},
            "attrs": {str(k): repr(v) for k, v in src.attrs.items()},
            "num_warps": compiled.metadata.num_warps}
    return [(rec, spec)]


# -- the calls -------------------------------------------------------------------------------------

BIG_INTS = [0, 1, 2, 3, 15, 16, 17, 32, 48, 1000, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -1, -16, -2**31,
            -2**31 - 1, -2**31 - 16, 2**32, 2**40 + 3, 2**40 + 16, 2**63 - 16, 2**63 - 1, 2**63, 2**63 + 16,
            2**64 - 16, 2**64 - 1, -2**63, -2**63 + 16]
SIZES = [1, 15, 16, 17, 64, 100, 256, 1000, 1024, 5000]
FLOATS = [0.0, 1.0, -2.5, 0.1, 1e30, -3.5e-8, 65504.0]


def int_class(v: int) -> tuple:
    """What Triton's binder specializes an int on: its type, == 1, % 16 == 0."""
    t = "i32" if -2**31 <= v < 2**31 else "i64" if -2**63 <= v < 2**63 else "u64"
    return t, v == 1, v % 16 == 0


class Calls:
    """Random call arguments. Every choice Triton specializes on (None or not,
    dtype, alignment, an int's class, int or float) comes from `r`, seeded by
    one of a few templates per kernel, so that specializations recur and the
    sequence crosses between them often; the values inside a class (addresses,
    which int of that class) come from `v`, fresh per call. Addresses are new
    on every call, so a stale pointer shows."""

    def __init__(self, template: random.Random, values: random.Random, counter: list):
        self.r, self.v, self.counter = template, values, counter

    def buf(self, dtypes=("fp16", "fp32", "bf16"), aligned: float = 0.8) -> Buffer:
        self.counter[0] += 1 << 24
        dtype = self.r.choice(dtypes)
        off = 0 if self.r.random() < aligned else self.r.choice([2, 4, 8]) * (1 if DTYPES[dtype].itemsize <= 2 else 2)
        return Buffer(BASE + self.counter[0] + off, dtype)

    def maybe(self, p: float, make):
        return None if self.r.random() < p else make()

    def int_(self, pool=BIG_INTS):
        cls = int_class(self.r.choice(pool))
        return self.v.choice([x for x in pool if int_class(x) == cls])

    def pick(self, options):
        return self.r.choice(options)


def grid_1d(meta):
    return (triton.cdiv(meta["n"], meta["BLOCK"]),)


def optional_inputs(c: Calls):
    y = c.maybe(0.4, c.buf)
    scale = c.maybe(0.5, lambda: c.buf(("fp32",)))
    args = (c.buf(), y, c.buf(), scale, c.maybe(0.5, lambda: c.int_([1, 2, 3, 5, 16, 32, 2**31 + 16, 2**31 + 32])),
            c.int_(SIZES), c.pick(FLOATS + [2, 1]), c.pick([True, False]))
    return args, {"BLOCK": c.pick([64, 128]), "HAS_SCALE": scale is not None}, grid_1d


def int_kinds(c: Calls):
    r = c.r
    i64 = [v for v in BIG_INTS if -2**63 <= v < 2**63]
    # x is never 1 or True: the kernel's `(x * 2.0).to(...)` does not compile on a constexpr. k (tl.int8)
    # is never negative: Triton 3.5/3.6's C launcher parses an int8 as an unsigned byte and refuses
    # negative values (3.7+ passes them, as lazytriton does on every version).
    args = (c.buf(("i64",)), c.buf(("fp16", "fp32", "i32")), c.buf(("fp16", "fp32", "i32"), aligned=0.5),
            c.int_(), c.int_(), c.int_(i64) if r.random() < 0.9 else True, c.int_(), c.int_(),
            r.choice([0.5, -2.0, 1, 7, True, 65504.0]), r.choice([True, False, 0, 1]),
            r.choice([0, 1, 16, 2**32 - 1, 2**31]), r.choice([0, 1, 127, 16, 100]),
            r.choice(FLOATS + [16, 2**31, 3]), r.choice([True, False, 0, 1, 7]))
    return args, {"BLOCK": 16}, (1,)


def tuned_heuristics(c: Calls):
    args = (c.buf(("fp16", "fp32")), c.maybe(0.5, lambda: c.buf(("fp32",))), c.buf(("fp32",)),
            c.pick([16, 64, 100, 256, 1000]), c.pick([0.5, 2, 1, -1.0]))
    return args, {}, grid_1d


def heuristic_on_int(c: Calls):
    return (c.buf(), c.buf(), c.int_([16, 48, 100, 1000, 1001, 5000, 4096])), {"BLOCK": c.pick([64, 256])}, grid_1d


def heuristic_over_tuned(c: Calls):
    return (c.buf(("fp32", "fp16")), c.buf(("fp32",)), c.pick([16, 64, 100, 256, 1000])), {}, grid_1d


def tuple_args(c: Calls):
    inner = (c.maybe(0.4, lambda: c.int_([1, 2, 5, 16, 32, 2**31, 2**31 + 16, -3])),
             c.maybe(0.4, lambda: c.pick([0.5, 2.0, 1])))
    xs = (c.buf(("fp32", "fp16")), inner, c.maybe(0.5, lambda: c.buf(("fp32",))))
    return (xs, c.buf(("fp32",)), c.int_([16, 64, 1])), {"BLOCK": 64}, (1,)


def desc_scale(c: Calls):
    r = c.r
    from triton.tools.tensor_descriptor import TensorDescriptor

    dtype = r.choice(["fp16", "fp32"])
    bm, bn = r.choice([(16, 32), (32, 64), (64, 64)])
    M, N = r.choice([(128, 128), (96, 160), (64, 256)])
    pitch = N + r.choice([0, 64])
    pad = r.choice(["zero", "nan"])
    d_in = TensorDescriptor(c.buf((dtype,), aligned=1.0), [M, N], [pitch, 1], [bm, bn], pad)
    d_out = TensorDescriptor(c.buf((dtype,), aligned=1.0), [M, N], [N, 1], [bm, bn])
    return (d_in, d_out, c.pick([0.5, 2, -1.0])), {"BM": bm, "BN": bn}, (triton.cdiv(M, bm), triton.cdiv(N, bn))


def option_params_tuned(c: Calls):
    return (c.buf(("fp32", "fp16")), c.buf(("fp32",)), c.pick([16, 64, 100, 256, 1000])), {}, grid_1d


def option_params(c: Calls):
    x, out, n, block = c.buf(("fp32", "fp16")), c.buf(("fp32",)), c.pick([16, 64, 100, 1000]), c.pick([64, 128])
    how = c.pick(["keyword", "positional", "default"])
    if how == "positional":  # then no launch option: Triton launches with its default num_warps
        return (x, out, n, block, c.pick([2, 8])), {}, grid_1d
    return (x, out, n), {"BLOCK": block, **({"num_warps": c.pick([2, 8])} if how == "keyword" else {})}, grid_1d


def option_params_heuristic(c: Calls):
    return (c.buf(("fp32", "fp16")), c.buf(("fp32",)), c.pick([16, 64, 100, 256, 1000, 4096])), \
        {"BLOCK": c.pick([64, 128])}, grid_1d


CASES = {"optional_inputs": (dk.optional_inputs, optional_inputs),
         "int_kinds": (dk.int_kinds, int_kinds),
         "tuned_heuristics": (dk.tuned_heuristics, tuned_heuristics),
         "heuristic_on_int": (dk.heuristic_on_int, heuristic_on_int),
         "heuristic_over_tuned": (dk.heuristic_over_tuned, heuristic_over_tuned),
         "tuple_args": (dk.tuple_args, tuple_args),
         "desc_scale": (dk.desc_scale, desc_scale),
         "option_params_tuned": (dk.option_params_tuned, option_params_tuned),
         "option_params": (dk.option_params, option_params),
         "option_params_heuristic": (dk.option_params_heuristic, option_params_heuristic)}


# -- keywords beside the arguments ------------------------------------------------------------------

LAUNCH_OPTIONS = {"num_warps": [2, 4, 8], "num_stages": [2, 3], "num_ctas": [1], "maxnreg": [128],
                  "launch_pdl": [True, False], "launch_cooperative_grid": [True, False]}


def set_by(fn) -> tuple[set, set]:
    """(names its triton.heuristics set, meta-parameters its autotune configs set)."""
    heur, cfg = set(), set()
    while not isinstance(fn, triton.runtime.JITFunction):
        if isinstance(fn, Heuristics):
            heur |= set(fn.values)
        else:
            cfg |= {k for c in fn.configs for k in c.kwargs}
        fn = fn.fn
    return heur, cfg


def config_options(fn) -> set:
    """The launch options an autotuned kernel's configs set (Config.all_kwargs())."""
    while not isinstance(fn, triton.runtime.JITFunction):
        if isinstance(fn, Autotuner):
            return {k for c in fn.configs for k in c.all_kwargs() if k in LAUNCH_OPTIONS}
        fn = fn.fn
    return set()


def keywords(fn, c: Calls) -> dict:
    """Keywords a call passes beside its arguments, as library code does: launch options
    (Triton merges them with an autotuned kernel's configs, and refuses those a config
    sets: num_warps, num_stages and num_ctas every triton.Config sets), values a
    triton.heuristics sets (it overwrites them), and now and then a meta-parameter an
    autotune config sets (refused). From the template's choices: specializations recur."""
    r = c.r
    heur, cfg = set_by(fn)
    out = {}
    # An autotuned kernel with option-named parameters: the options its configs set (refused each time)
    # only in the sweep, so that most of its calls launch.
    options = sorted(set(LAUNCH_OPTIONS) - (config_options(fn) if set(fn.arg_names) & set(LAUNCH_OPTIONS) else set()))
    if r.random() < (0.2 if cfg else 0.35):
        for name in r.sample(options, r.choice([1, 1, 2])):
            out[name] = r.choice(LAUNCH_OPTIONS[name])
    for name in sorted(heur):
        if r.random() < 0.3:
            out[name] = r.choice([True, False, 0, 3])
    if cfg and r.random() < 0.03:
        out[sorted(cfg)[0]] = 64
    return out


def sweep(fn) -> list[dict]:
    """Each keyword pattern once, after a kernel's random calls (which may miss some): each
    launch option alone, two together, each value a heuristic sets, and a meta-parameter a
    config sets (Triton refuses it)."""
    heur, cfg = set_by(fn)
    out = [{"num_warps": 2}, {"num_warps": 8}, {"num_stages": 2}, {"num_ctas": 1}, {"maxnreg": 128},
           {"launch_pdl": True}, {"launch_cooperative_grid": True}, {"launch_pdl": True, "maxnreg": 128}]
    return out + [{name: 3} for name in sorted(heur)] + [{name: 64} for name in sorted(cfg)]


def for_lazytriton(v):
    """Triton's host TensorDescriptor is taken by lazytriton as it is (duck-typed);
    everything else is the same object for both sides."""
    return v


def same(a: dict, b: dict, stream: bool = False) -> bool:
    """The same launch; `stream`: on the same stream too (a call that named none)."""
    return all(a[k] == b[k] for k in ("image", "grid", "block", "shared", "attrs", "params")) and (
        not stream or a["stream"] == b["stream"])


def short(v) -> str:
    if isinstance(v, tuple):
        return "(" + ", ".join(short(x) for x in v) + ")"
    if isinstance(v, Buffer):
        return f"{v.tdtype}@{v.ptr % 16}"
    if type(v).__name__ == "TensorDescriptor":
        return f"desc<{v.base.tdtype}{v.block_shape}>"
    return repr(v)


class Face:
    def __init__(self, name: str, kernel_name: str, fn):
        self.name, self.kernel_name, self.fn = name, kernel_name, fn
        self.k = lazytriton.kernel(fn)
        self.chosen: dict = {}  # Triton's specialization (sans config) -> config image lazytriton launched

    NAMES_NO_STREAM = True  # its calls name no stream: they must go to Triton's

    def call(self, args, kwargs, grid) -> list[dict]:
        self.k[grid](*args, **kwargs)
        return records()

    def adapt(self, args: tuple) -> tuple:
        """The call's arguments as this face can pass them."""
        return args

    def takes(self, kwargs: dict) -> bool:
        """Whether this face can pass these keywords as Triton's call does."""
        return True


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def check_call(face: Face, i: int, args, kwargs, grid, report: dict) -> None:
    if not face.takes(kwargs):
        report["other_face"] += 1
        return
    args = face.adapt(args)
    label = f"{face.name} {face.kernel_name} call {i}: ({', '.join(short(a) for a in args)}; {kwargs})"
    try:
        theirs = triton_runs(face.fn, args, dict(kwargs), grid)
        t_err = None
    except Exception as exc:  # Triton refuses the call: so must lazytriton
        records()
        theirs, t_err = None, _err(exc)
    try:
        ours = face.call(args, kwargs, grid)
        o_err = None
    except Exception as exc:
        ours, o_err = records(), _err(exc)
    report["calls"] += 1
    if t_err or o_err:
        report["refused"] += 1
        if not (t_err and o_err):
            report["failures"].append(f"{label}: Triton {'refused: ' + t_err if t_err else 'launched'}, lazytriton "
                                      f"{'refused: ' + o_err if o_err else 'launched'}")
        return
    if not ours:
        report["failures"].append(f"{label}: lazytriton launched nothing")
        return
    for got in ours:
        if not any(same(got, rec, face.NAMES_NO_STREAM) for rec, _ in theirs):
            t = [dict(rec, spec=spec) for rec, spec in theirs]
            report["failures"].append(f"{label}: lazytriton launched {got}\n  Triton's launches (per config): {t}")
            return
    # One specialization, one winner: the last launch is the config lazytriton runs from now on.
    named = dict(zip(face.k.spec.arg_names, args))
    # (A call's keywords too: lazytriton tunes apart each set of launch options, which are the compile's,
    # and each value of a keyword a heuristic reads, which Triton's autotuner keys on neither.)
    options = sorted((k, repr(v)) for k, v in kwargs.items())
    spec_key = json.dumps([[s for _, s in theirs], [repr(named.get(n)) for n in face.k.spec.tune_keys], options],
                          sort_keys=True)
    winner = next(j for j, (rec, _) in enumerate(theirs) if same(ours[-1], rec))
    report["specializations"].add(json.dumps([s for _, s in theirs], sort_keys=True))
    if len(theirs) > 1:
        prev = face.chosen.setdefault(spec_key, winner)
        if prev != winner:
            report["failures"].append(f"{label}: one call, two winners (configs {prev} and {winner})")


# -- the JAX face ----------------------------------------------------------------------------------

JAX_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32", "i32": "int32", "i64": "int64"}


# jax-triton's compile options: num_warps/num_stages/num_ctas are triton_call's own arguments, the
# others go in backend_options.
JAX_EXPLICIT = ("num_warps", "num_stages", "num_ctas")


def jax_call(face: Face, args, kwargs, grid, out_index: int) -> list[dict]:
    """The call through lazytriton.jax: arrays are operands (XLA buffers at the
    arrays' addresses), the argument at `out_index` the output; scalars, None and
    tuples as given. Resolved as the handler's first execution resolves it, then
    launched twice by the handler's C++ from the buffer addresses."""
    import jax
    import jax.numpy as jnp

    from lazytriton import jax as ltj
    from lazytriton.jax import ffi as jax_ffi

    leaves, bufs = [], []

    def to_aval(v):
        if isinstance(v, Buffer):
            leaves.append(v)
            n = v.nbytes // v.dtype.itemsize
            return jax.ShapeDtypeStruct((n,), jnp.dtype(JAX_DTYPES[v.tdtype]))
        return v

    names = face.k.spec.arg_names
    # Operands by keyword (lazytriton.jax binds them by parameter name, as jax-triton 0.4 does):
    # the output parameter is then the one left unfilled, wherever it sits.
    arrays = [(names[j], a) for j, a in enumerate(args) if j != out_index and isinstance(a, Buffer)]
    statics = {names[j]: a for j, a in enumerate(args) if j != out_index and not isinstance(a, Buffer)}
    avals_in = [to_aval(a) for _, a in arrays]
    out = args[out_index]
    out_aval = jax.ShapeDtypeStruct((out.nbytes // out.dtype.itemsize,), jnp.dtype(JAX_DTYPES[out.tdtype]))

    backend = {k: v for k, v in kwargs.items() if k in LAUNCH_OPTIONS and k not in JAX_EXPLICIT}
    kwargs = {k: v for k, v in kwargs.items() if k not in backend}

    def f(*traced):
        operands = {**statics, **{n: t for (n, _), t in zip(arrays, traced)}}
        return ltj.triton_call(kernel=face.fn, out_type=out_aval, grid=grid, backend_options=backend or None,
                               **operands, **kwargs)

    text = jax.jit(f).trace(*avals_in).lower(lowering_platforms=("cuda",)).as_text()
    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text)
    d = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))
    site = jax_ffi.Site(d)
    bufs = [(b.ptr, b.nbytes) for b in leaves] + [(out.ptr, out.nbytes)]
    site.d["n_inputs"] = len(bufs) - 1
    entry = site.resolve(tuple(bufs), 0, 0, False)
    trials = records()
    for _ in range(2):
        lazytriton._core.launch_fixed(entry, 0, [b[0] for b in bufs])
    return trials + records()


class JaxFace(Face):
    NAMES_NO_STREAM = False  # XLA's stream, given
    OUT = {"optional_inputs": 2, "int_kinds": 0, "tuned_heuristics": 2, "heuristic_on_int": 1, "heuristic_over_tuned": 1}

    def call(self, args, kwargs, grid):
        if callable(grid):  # jax-triton's grid callables see the meta-parameters only: the rest by closure
            named = dict(zip(self.k.spec.arg_names, args))
            grid = (lambda g: lambda meta: g({**named, **meta}))(grid)
        return jax_call(self, args, kwargs, grid, self.OUT[self.kernel_name])

    def adapt(self, args: tuple) -> tuple:
        # XLA's buffers are aligned (to 16 bytes at least): so are this face's.
        return tuple(Buffer(a.ptr & ~15, a.tdtype, a.nbytes) if isinstance(a, Buffer) else a for a in args)

    def takes(self, kwargs: dict) -> bool:
        # jax-triton's rules where they differ from Triton's (lazytriton.jax follows them): an autotuned
        # kernel's configs set num_warps/num_stages/num_ctas over the call's, and a meta-parameter the call
        # gives drops the configs that set it otherwise; launch_cooperative_grid is no triton_call option.
        _, cfg = set_by(self.fn)
        if "launch_cooperative_grid" in kwargs:
            return False
        return not cfg or not (set(kwargs) & (cfg | set(JAX_EXPLICIT)))


# -- the C++ bundle face ------------------------------------------------------------------------------

BUNDLE_GRIDS = {"optional_inputs": "n", "int_kinds": None, "heuristic_on_int": "n"}


def _annotation_type(ann) -> str | None:
    """The C++ signature type an annotated scalar parameter is declared with."""
    name = getattr(ann, "name", None) or str(ann).rsplit(".", 1)[-1]
    return {"int1": "u1", "fp16": "fp16", "float16": "fp16", "fp32": "fp32", "float32": "fp32"}.get(
        name, name.replace("int", "i").replace("ui", "u") if "int" in name else None)


def cpp_call(fn, args, kwargs, grid_n) -> str:
    """One line of bundle_calls.cc's input: the call as a C++ program writes it,
    its signature spelled from Triton's rules (pointers *dtype, ints by the class
    of the value or their annotation, bools u1, floats fp32), None pointers and
    the given meta-parameters as constexprs."""
    import inspect

    jit = fn
    while not isinstance(jit, triton.runtime.JITFunction):
        jit = jit.fn
    supplied = set()
    k = fn
    while not isinstance(k, triton.runtime.JITFunction):
        supplied |= set(getattr(k, "values", {}) or {}) | {n for c in getattr(k, "configs", []) for n in c.kwargs}
        k = k.fn
    params = [p for p in inspect.signature(jit.fn).parameters.values() if p.name not in supplied]
    sig, consts, cargs = [], [f"{n}={'b:' + str(int(v)) if isinstance(v, bool) else 'i:' + str(v)}"
                               for n, v in kwargs.items()], []
    for p, v in zip(params, args):
        ann = p.annotation
        if ann is not inspect.Parameter.empty and "constexpr" in str(ann):
            continue
        t = _annotation_type(ann) if ann is not inspect.Parameter.empty else None
        if v is None:
            consts.append(f"{p.name}=n")
        elif isinstance(v, Buffer):
            sig.append("*" + v.tdtype)
            cargs.append(f"p:{v.ptr}")
        elif isinstance(v, bool):
            sig.append(t or "u1")
            cargs.append(f"b:{int(v)}")
        elif isinstance(v, int):
            sig.append(t or int_class(v)[0])
            cargs.append(f"u:{v}" if v >= 2**63 else f"i:{v}")
        else:
            sig.append(t or "fp32")
            cargs.append(f"f:{v!r}")
    g = f"cdiv:{dict(zip([p.name for p in params], args))[grid_n]}" if grid_n else "1,1,1"
    return "\t".join([fn_source(fn), ",".join(sig), ";".join(consts), g, ",".join(cargs)])


def fn_source(fn) -> str:
    jit = fn
    while not isinstance(jit, triton.runtime.JITFunction):
        jit = jit.fn
    return f"kernels.differential_kernels:{jit.fn.__name__}"


def bundle_face(calls: int, seed: int, templates: int, kernels, exe: str, report_out: dict) -> None:
    """Per kernel: calls // 8 random calls, each written into a bundle by Bundle.add
    (resolved by lazytriton) and listed for the C++ program, which launches them all
    from the bundle at the end; its launches are then compared, in order, with
    Triton's launches of the same calls."""
    import subprocess
    import tempfile

    from lazytriton.cpp.bundle import Bundle

    d = Path(tempfile.mkdtemp(prefix="lt-diff-bundle-", dir=Path.cwd()))  # the test's directory, not $TMPDIR
    bundle, lines, refs = Bundle(d / "bundle"), [], []
    for name, grid_n in BUNDLE_GRIDS.items():
        if kernels and name not in kernels:
            continue
        fn, make = CASES[name]
        rng = random.Random(f"{seed}/bundle/{name}")
        counter = [0]
        n_calls = 0
        todo = []
        for i in range(calls // 8):
            template = random.Random(f"{seed}/{name}/{rng.randrange(templates)}")
            chosen = Calls(template, rng, counter)
            args, kwargs, grid = make(chosen)
            todo.append((f"call {i}", args, {**kwargs, **keywords(fn, chosen)}, grid))
        for j, extra in enumerate(sweep(fn)):  # every keyword pattern once (keywords() may miss some)
            args, kwargs, grid = make(Calls(random.Random(f"{seed}/{name}/sweep"), rng, counter))
            todo.append((f"sweep {j}", args, {**kwargs, **extra}, grid))
        for what, args, kwargs, grid in todo:
            label = f"bundle {name} {what}: ({', '.join(short(a) for a in args)}; {kwargs})"
            try:
                theirs = triton_runs(fn, args, dict(kwargs), grid)
            except Exception as exc:
                records()
                refs.append((label, None, _err(exc)))
                lines.append(cpp_call(fn, args, kwargs, grid_n))
                continue
            try:
                bundle.add(fn, *args, grid=grid, stream=0, source=fn_source(fn), **kwargs)
            except Exception as exc:
                report_out["failures"].append(f"{label}: Triton launched, Bundle.add refused: {_err(exc)}")
                records()
                continue
            records()  # the resolution's own launches (tuning trials): the other faces check those
            refs.append((label, theirs, None))
            lines.append(cpp_call(fn, args, kwargs, grid_n))
            n_calls += 1
        report_out["faces"].setdefault("bundle", {})[name] = {"calls": n_calls, "refused": 0, "specializations": 0}
    (d / "calls.txt").write_text("\n".join(lines) + "\n")
    p = subprocess.run([exe, str(d / "bundle"), str(d / "calls.txt")], capture_output=True, text=True, timeout=600)
    if p.returncode != 0 or "done" not in p.stdout:
        report_out["failures"].append(f"bundle_calls failed ({p.returncode}): {p.stdout[-2000:]}{p.stderr[-2000:]}")
        return
    refused = {int(m.group(1)): m.group(2) for m in re.finditer(r"^refused (\d+) (.*)$", p.stdout, re.M)}
    got = iter(records())
    for line_no, (label, theirs, t_err) in enumerate(refs, 1):
        if line_no in refused or t_err:
            if not (line_no in refused and t_err):
                report_out["failures"].append(f"{label}: Triton {'refused: ' + t_err if t_err else 'launched'}, "
                                              f"the C++ bundle {'refused: ' + refused[line_no] if line_no in refused else 'launched'}")
            continue
        rec = next(got, None)
        report_out["bundle_launches_compared"] = report_out.get("bundle_launches_compared", 0) + 1
        if rec is None or not any(same(rec, r) for r, _ in theirs):
            report_out["failures"].append(f"{label}: the C++ bundle launched {rec}\n  Triton's launches (per config): "
                                          f"{[dict(r, spec=s) for r, s in theirs]}")
    for name, k in report_out["faces"].get("bundle", {}).items():
        print(f"bundle    {name:18s} {k['calls']:5d} calls", flush=True)


def run(calls: int, seed: int, faces: list[str], kernels: list[str] | None, templates: int = 16) -> dict:
    knobs.runtime.launch_enter_hook = None
    triton.runtime.driver.set_active(FakeDeviceDriver())
    use_side_stream()
    out = {"triton": triton.__version__, "seed": seed, "faces": {}, "failures": []}
    for face_name in [f for f in faces if f != "bundle"]:
        os.environ["LAZYTRITON_STUB_BUILD"] = "off" if face_name == "generic" else "sync"
        for name, (fn, make) in CASES.items():
            if kernels and name not in kernels:
                continue
            if face_name == "jax" and name not in JaxFace.OUT:
                continue
            if name == "desc_scale" and not hasattr(triton.language, "make_tensor_descriptor"):
                continue
            face = (JaxFace if face_name == "jax" else Face)(face_name, name, fn)
            rng = random.Random(f"{seed}/{face_name}/{name}")
            # The generated face builds one C++ stub per argument shape (~1 s each): fewer templates.
            n_templates = templates // 2 if face_name == "generated" else templates
            counter = [0]
            report = {"calls": 0, "refused": 0, "other_face": 0, "keywords": 0, "specializations": set(),
                      "failures": []}
            n = calls // 8 if face_name == "jax" else calls
            t0 = time.perf_counter()
            for i in range(n):
                try:
                    template = random.Random(f"{seed}/{name}/{rng.randrange(n_templates)}")
                    chosen = Calls(template, rng, counter)
                    args, kwargs, grid = make(chosen)
                    extra = keywords(fn, chosen)
                    report["keywords"] += bool(extra)
                    check_call(face, i, args, {**kwargs, **extra}, grid, report)
                except Exception:
                    report["failures"].append(f"{face_name} {name} call {i}: the check raised\n"
                                              f"{traceback.format_exc()}")
                if len(report["failures"]) >= 5:
                    break
            swept = {"calls": 0, "refused": 0, "other_face": 0, "keywords": 0, "specializations": set(),
                     "failures": []}
            for j, extra in enumerate(sweep(fn)):  # on one template: one specialization but for the keywords
                args, kwargs, grid = make(Calls(random.Random(f"{seed}/{name}/sweep"), rng, counter))
                try:
                    check_call(face, f"sweep {j}", args, {**kwargs, **extra}, grid, swept)
                except Exception:
                    swept["failures"].append(f"{face_name} {name} sweep {j}: the check raised\n"
                                             f"{traceback.format_exc()}")
            report["failures"] += swept["failures"]
            out["faces"].setdefault(face_name, {})[name] = {
                "calls": report["calls"], "refused": report["refused"], "keywords": report["keywords"],
                "other_face": report["other_face"], "specializations": len(report["specializations"]),
                "sweep": {k: swept[k] for k in ("calls", "refused", "other_face")},
                "seconds": round(time.perf_counter() - t0, 1)}
            out["failures"] += report["failures"]
            print(f"{face_name:9s} {name:20s} {report['calls']:5d} calls, {len(report['specializations']):3d} "
                  f"Triton specializations, {report['refused']:3d} refused by both, {report['keywords']:3d} with "
                  f"keywords; keyword sweep: {swept['calls']} calls, {swept['refused']} refused by both; "
                  f"{len(report['failures'])} failures ({time.perf_counter() - t0:.1f} s)", flush=True)
    if "bundle" in faces:
        os.environ["LAZYTRITON_STUB_BUILD"] = "off"
        bundle_face(calls, seed, templates, kernels, os.environ["FAKE_CUDA_BUNDLE_CALLS_EXE"], out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--calls", type=int, default=400, help="calls per kernel and face (the JAX face: a 1/8)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faces", default="generic,generated,jax")
    ap.add_argument("--kernels", default="")
    ap.add_argument("--templates", type=int, default=16,
                    help="specialization templates per kernel (the generated face: half as many)")
    a = ap.parse_args(argv)
    faces = [f for f in a.faces.split(",") if f]
    if "bundle" in faces and not os.environ.get("FAKE_CUDA_BUNDLE_CALLS_EXE"):
        faces.remove("bundle")  # bundle_calls.cc not built (no cmake)
    if "jax" in faces:
        try:
            import jax  # noqa: F401
        except ImportError:
            faces.remove("jax")
    report = run(a.calls, a.seed, faces, [k for k in a.kernels.split(",") if k] or None, a.templates)
    Path(a.out).write_text(json.dumps(report))
    return 1 if report["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
