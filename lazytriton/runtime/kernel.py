"""The lazy kernel: `lazytriton.kernel(fn)[grid](*args)`.

Nothing is compiled when the object is made. The first call with a new
argument shape builds (or loads) a C++ stub for that shape; the first call with
a new specialization resolves it once (persistent cache, else compile the
candidates and tune them on these very arguments); every later call goes
through the stub straight to cuLaunchKernelEx.
"""
from __future__ import annotations

import difflib
import inspect
import logging
import os
import sys
import threading
from typing import Any

from .. import _core
from ..cache import Cache, TuningRecord, get_cache
from ..settings import TUNING_MODES, remote_cache_url, tuning_mode
from ..compile import compiler
from ..compile.compiler import Binder
from . import online, resolve, stubgen, torch_reader
from ..model import specialize, tensor_desc, tuples
from ..model.arrays import ANY_DEVICE, array_device, array_info, is_array
from .resolve import CAPTURE_REMEDY_CALL, CAPTURE_REMEDY_JAX, Resolution, Resolved
from ..model.spec import KernelSpec, ReadRecorder, kernel_spec
from ..model.specialize import OPTION_NAMES, Shape, Slot
from .tuner import TuneOptions

log = logging.getLogger("lazytriton")

HEURISTICS_ARG = "__heuristics__"

def stats() -> dict:
    """Counters of this process: Python-side work, online tuning's (online_*) and the C++ launch counters."""
    return {**resolve.counters(), **{f"online_{k}": v for k, v in online.counters().items()}, **_core.counters()}


def stream_handle(stream: Any) -> int:
    """An int CUstream from an int, a stream object (CuPy .ptr, PyTorch
    .cuda_stream), or None: the stream a call that names none launches on, as
    Triton's launcher picks it (_core.default_stream: torch's current stream of
    the launch device when a torch tensor is among the call's arguments; else
    CuPy's current stream if CuPy is imported; else torch's if torch is; else 0)."""
    if stream is None:
        return _core.default_stream(())
    if isinstance(stream, int):
        return stream
    for attr in ("ptr", "cuda_stream", "handle"):
        value = getattr(stream, attr, None)
        if isinstance(value, int):
            return value
    raise TypeError(f"stream must be an int CUstream or a stream object, got {type(stream).__name__}")


# `k[grid]` is _core.LaunchBase's subscript (csrc/python/launcher.cc): a _core.Launch,
# whose call `(*args, stream=None, **kwargs)` binds the arguments, converts the stream and
# calls the stubs in C, and hands anything else to LazyKernel._run, the one slow path.
_Launch = _core.Launch
_core.register_stream_handle(stream_handle)
_stream_rule = stream_handle  # a replacement (tests, users) is called as the C launcher calls it


class LazyKernel(_core.LaunchBase):
    """A Triton kernel (jit, autotune or heuristics) launched through lazytriton.
    _stubs, _handle, _n_call, _python_heuristics and _needs_probe are slots of
    _core.LaunchBase, read by the C launcher."""

    def __init__(self, kernel: Any, *, cache: Cache | None = None, tune_options: TuneOptions | None = None,
                 tuning: str | None = None):
        self.spec: KernelSpec = kernel_spec(kernel)
        self.name = self.spec.name
        self._cache = Cache.given(cache, f"kernel {self.name}")  # a directory: a Cache there
        self.tune_options = TuneOptions.given(tune_options, f"kernel {self.name}")
        if tuning is not None and tuning not in TUNING_MODES:
            raise ValueError(f"kernel {self.name}: tuning={tuning!r}: tuning takes "
                             f"{', '.join(map(repr, TUNING_MODES))} or None (LAZYTRITON_TUNING decides)")
        self.tuning = tuning
        # Specializations tuned online, still deciding: call key -> online.Session.
        self._online: dict[tuple, online.Session] = {}
        supplied = self.spec.supplied_names()
        self._supplied = supplied
        self.call_params = [p for p in self.spec.params if p.name not in supplied]
        # Keywords a call may not pass: as Triton's Autotuner.run, which refuses a keyword a config
        # also sets ("Conflicting meta-parameters" against Config.kwargs, or a repeated keyword
        # against Config.all_kwargs(): num_warps, num_stages and num_ctas unless None, maxnreg and
        # ir_override when given), name -> why. Other launch options pass through to every config.
        self._config_sets = config_keywords(self.spec)
        # What a heuristic sets, a call's keyword of that name is overwritten by (Triton's
        # Heuristics.run); the heuristic sees the call's value, so it is kept (in the call key)
        # for those a heuristic may read, dropped for the others (_kept_keywords: those their
        # code names, then those the probe of the first call sees read).
        self._overwritten = self.spec.heuristic_names() - set(self._config_sets)
        self._kept_keywords: set[str] = self.spec.heuristics_may_read(self._overwritten)
        self._refusal = _every_call_refusal(self.spec, self._config_sets)
        self._n_call = len(self.call_params)
        # Call parameters named like a launch option (`num_warps: tl.constexpr`): a keyword of that
        # name binds the parameter and is the launch option too, as in Triton (bound in Python).
        self._option_params = frozenset(p.name for p in self.call_params if p.name in OPTION_NAMES)
        # The resolve-once table the stubs look winners up in; _first_call resolves its keys.
        self._core = _core.ResolveTable(self.name)
        compiler.warm_up()  # the compile server and Triton's specializer, ready by the first call that compiles
        if remote_cache_url():  # the remote cache's client imported and connected by the first call
            self.cache.warm_up()
        self._handle = self._core.handle
        self._stubs = ()  # the stub objects, tried in order by the C launcher
        self._shapes: dict[Any, Shape] = {}  # stub -> the argument shape it reads
        self._heuristic_reads: set[str] | None = None  # None: heuristics run in Python per call
        self._python_heuristics = False
        self._needs_probe = bool(self.spec.heuristics)
        self._plans: dict[tuple, Any] = {}  # (n positional, kwarg names...) -> fast binder
        self._interned: dict = {}
        self._binders: dict = {}
        self.loaded_kernels: dict[str, Any] = {}  # compile key -> loaded _core.Kernel
        self._lock = threading.Lock()
        self.records: list[TuningRecord] = []  # tuning outcomes of this process
        # Arguments whose contents before the call do not matter (a JAX call's
        # fresh outputs): never saved and restored around tuning trials.
        self.scratch_args: frozenset = frozenset()

    def __repr__(self) -> str:
        return f"lazytriton.LazyKernel({self.name})"

    @property
    def tuning_mode(self) -> str:
        """How this kernel's new specializations are tuned: its `tuning=`, else LAZYTRITON_TUNING's
        mode ("first_call", "online" or "off"); LAZYTRITON_TUNING=off turns timing off for every kernel."""
        program = tuning_mode()
        return "off" if program == "off" else (self.tuning or program)

    @property
    def n_call(self) -> int:
        """How many arguments a call passes (the parameters the configs and heuristics do not set)."""
        return self._n_call

    def as_call(self, values: list, options: dict) -> tuple[list, dict]:
        """(positional, keywords) of a call made from every call parameter's value and the
        call's launch options, for faces that hold both (the JAX call site, C++ bundles): a
        parameter named like a launch option (`num_warps: tl.constexpr`), and those after it,
        go by keyword, so that its value is the launch option too, as a Triton call's keyword is
        (an option the call gives sets such a parameter)."""
        names = [p.name for p in self.call_params]
        cut = next((i for i, n in enumerate(names) if n in self._option_params), len(values))
        # A launch option the call gives (triton_call's num_warps=8) is that parameter's value too.
        return list(values[:cut]), {**dict(zip(names[cut:], values[cut:])), **options}

    @property
    def heuristics_in_python(self) -> bool:
        """Whether the heuristics read arrays, so that they run in Python on every call."""
        return self._python_heuristics

    @property
    def heuristic_reads(self) -> set[str] | None:
        """The arguments the heuristics read (keyed like autotune keys), once probed; None before."""
        return self._heuristic_reads

    # k[grid]: _core.LaunchBase.__getitem__.

    def _fast_plan(self, nargs: int, names: tuple):
        """For the C launcher: how a call with `nargs` positional arguments and the
        keyword arguments `names` (stream= aside) makes its call tuple, once
        _bind_slow has bound such a call and kept a plan for it. Per parameter after
        the positional ones: the index of its value in `names`, or a 1-tuple holding
        its default. None: not yet (the call goes to _run); False: never."""
        tail = self.call_params[nargs:]
        dropped = set(names) - {p.name for p in tail}  # keywords no parameter takes: the plan leaves them out
        if nargs > self._n_call or not dropped <= self._overwritten or self._option_params.intersection(names):
            return False
        if self._python_heuristics or self._needs_probe:
            return None
        if dropped & self._kept_keywords:  # a heuristic reads the call's value: bound in Python
            return False
        if (nargs, *names) not in self._plans:
            return None
        return tuple(names.index(p.name) if p.name in names else (p.default,) for p in tail)

    @property
    def cache(self) -> Cache:
        return self._cache or get_cache()  # the process's one default cache (the CLI's and tests' too)

    # -- the call path -------------------------------------------------------------

    # k.run(*args, grid=, stream=None, warmup=False, **kwargs), Triton's spelling
    # of k[grid](...): _core.LaunchBase.run, the same C hot path.

    def resolve(self, *args, grid: Any = None, stream: Any = None, mode: str = "tune", per_call: bool = False,
                **kwargs) -> "Resolved":
        """The winner for these arguments (persistent cache, else compile and tune
        on them: then `grid` is needed), without launching it. For callers that
        launch from C++ themselves: the JAX handler, C++ embedders.
        mode: "tune"; "record" (a cached winner or CaptureError: nothing may
        run on the stream); "first" (no tuning: the first config, not persisted).
        per_call: the caller launches each answer once and asks again on its next call (the
        JAX handler): a kernel tuned online then answers, until its winner is fixed, with
        this call's candidate (Resolved.this_call_only, its timer). Other callers get a
        winner tuned on this call."""
        args, shape, key = self._keyed_call(args, kwargs)
        s = stream if type(stream) is int else self._stream(stream, args)
        # No table here: these callers de-duplicate first calls in their own
        # (the JAX call site's, the bundle's). A tuned winner also serves k[grid].
        timer, this_call_only = None, False
        session = self._online.get(tuple(key)) if per_call else None
        got = self._resolution(key, args, s, grid, shape, mode, per_call=per_call) if session is None else None
        if isinstance(got, online.Session):
            session = self._online.setdefault(tuple(key), got)
        if session is not None:  # online tuning: this call's candidate, or the winner it just settled on
            pick = session.pick(first=got is session, capturing=mode != "tune" or _core.is_capturing(s))
            if pick.winner is None:
                got, timer, this_call_only = pick.arm.entry, pick.timer, True
            else:
                got = self._settle_online(tuple(key), pick.winner)
        entry = got
        if mode == "tune" and not this_call_only:
            self._core.install(list(key), entry)
            self._online.pop(tuple(key), None)  # tuned here: a session of the key, if any, is over
        names = list(shape.arg_names[:self._n_call])
        n_leaves = shape.call_leaves(self._n_call)
        # A descriptor's type is its dtype and block shape (Triton's tensordesc<fp16[64, 64]>).
        types = [specialize.kernel_type(sl, v, f"kernel {self.name}, argument {n}") if p else "constexpr"
                 for sl, p, v, n in zip(shape.slots, entry.is_param, shape.leaf_values(args), shape.names)]
        meta = dict(entry.meta or {})
        dims = None
        if grid is not None:
            g = grid({**dict(zip(names, args)), **meta}) if callable(grid) else grid
            g = (g,) if isinstance(g, int) else tuple(g)
            dims = (*g, 1, 1, 1)[:3]
        return Resolved(entry, names, tuple(args[:self._n_call]), types[:n_leaves], meta, dims, tuple(key),
                        list(shape.names[:n_leaves]), list(shape.table()[:n_leaves]), timer, this_call_only)


    def _keyed_call(self, args: tuple, kwargs: dict) -> tuple:
        """(the bound call, its shape, its call key) for callers that resolve without
        launching (resolve, compile_ahead): the key from the generated stub if it is
        built, else from the table-driven one (same key); no stub build is started,
        as these callers launch from C++ themselves or not at all."""
        if self._refusal:
            raise TypeError(self._refusal)
        args = self._bind_call(args, kwargs)
        shape = self._shape(args)
        self._check_launchable(shape, args)
        key = stubgen.stub_if_built(shape, self.name).key(args)
        if key is None:
            raise RuntimeError(f"kernel {self.name}: internal error: the stub built for these arguments rejected them")
        return args, shape, key

    def compile_ahead(self, *args, target: Any = None, soon: bool = False, **kwargs) -> "Future[int]":
        """Starts compiling, in the background, every candidate config of a
        call with these arguments, and persists the binaries; nothing is tuned
        or launched. That call's first execution then only tunes (or waits for
        candidates still compiling). Arrays may be stand-ins with no memory
        behind them (``lazytriton.model.arrays.DeviceArray(address, dtype,
        nbytes, shape)``): only their dtype and alignment count. For programs
        that know their calls early (the JAX face does this for every call
        site when a program is lowered). `target`: a compile target
        (``lazytriton.compile.target_for("sm_90")``), default the current
        device's. `soon`: the program runs this call next, with the others
        asked for so: their compiles then queue as a call's, the longest
        first across them, not after every call's and niced (the JAX face's
        sites of a program being lowered: its execution needs them all).
        Returns a Future of the number of candidates compiled."""
        from ..compile import schedule
        from ..compile.targets import device_target

        args, shape, key = self._keyed_call(args, kwargs)
        if target is None:
            target = device_target(_core.device_info(_core.current_device()))
        # Queued in the order asked for (a program's calling order), not the order the threads get to
        # them. Compiles asked for `soon` share one place, the longest first across them: a JAX
        # program's sites run in the order XLA schedules them, which lowering does not tell (an H200's
        # 16-site program ran its fourth-lowered matmul second).
        order = schedule.TOGETHER if soon else schedule.next_order()
        return _ahead().submit(Resolution(self, key, args, 0, None, shape).compile_ahead, target, order, soon)

    def _bind_call(self, args: tuple, kwargs: dict) -> tuple:
        """The positional call tuple the stubs read."""
        if kwargs or len(args) != self._n_call or self._python_heuristics or self._needs_probe:
            plan = self._plans.get((len(args), *kwargs))
            return plan(args, kwargs) if plan is not None else self._bind_slow(args, kwargs)
        return args

    def _stream(self, stream: Any, args: tuple) -> int:
        try:
            if stream is None and stream_handle is _stream_rule:  # the rule reads the call's arguments
                return _core.default_stream(tuple(args))
            return stream_handle(stream)
        except TypeError as exc:
            raise TypeError(f"kernel {self.name}: {exc}") from None

    def _run(self, grid: Any, stream: Any, args: tuple, kwargs: dict) -> tuple:
        """For the C launcher: the call tuple and the stream (an int) of a call it
        cannot bind itself; it then launches the call through the stubs."""
        call = self._bind_call(args, kwargs)
        return call, stream if type(stream) is int else self._stream(stream, call)

    def _first_call(self, stub: Any, key: tuple | None, args: tuple, stream: int, grid: Any) -> None:
        """For the C launcher: the one call into Python of a call it cannot launch yet.
        A new argument shape (stub None): its stub is made. A call key with no winner
        (the key `stub` answered, or the new stub's): resolved once, by this caller or
        by one it waits for (the kernel's table de-duplicates), and installed. The
        launcher then launches the call through that stub."""
        if self._refusal:
            raise TypeError(self._refusal)
        if stub is None:
            stub = self._add_stub(args)
            key = stub.key(args)
            if key is None:
                raise RuntimeError(f"kernel {self.name}: internal error: the stub made for these arguments "
                                   "rejected them")
        key = tuple(key)
        while True:
            session = self._online.get(key)
            if session is not None:  # tuned online: this call launches a candidate (or the winner, just decided)
                return self._online_call(session, key, stub, args, stream, grid)
            claim = self._core.claim(key)  # None: resolved meanwhile (or by the thread this one waited for)
            if claim is None:
                break
            with claim:
                if key in self._online:  # a session started while this thread waited: it serves the call
                    claim.release()
                    continue
                got = self._resolve(key, (args, stream, grid, stub))
                if not isinstance(got, online.Session):
                    claim.publish(got)
                    break
                self._online[key] = got
                claim.release()  # the callers waiting for the key join the session
            launched = self._online_call(got, key, stub, args, stream, grid, first=True)
            torch_reader.request(args)
            return launched
        # The stubs' fast reads of CUDA tensors, requested once per process, after the resolution: its
        # loading (or build) on another thread then competes with neither the compile nor the GIL.
        torch_reader.request(args)
        return None

    def _online_call(self, session: "online.Session", key: tuple, stub: Any, args: tuple, stream: int, grid: Any,
                     first: bool = False) -> bool | None:
        """A call of a specialization tuned online: launches the candidate the session picks
        (timed by events around the launch), through the call's stub from a table holding only
        that candidate; one that fails to launch is dropped and another launches. True: launched;
        None: the session settled, its winner is installed and the stub launches it."""
        launch = getattr(stub, "launch", stub)  # a built stub's launch(handle, grid, stream, args)
        capturing = _core.is_capturing(stream)
        while True:
            pick = session.pick(first=first, capturing=capturing)
            if pick.winner is not None:
                self._settle_online(key, pick.winner)
                return None
            try:
                if pick.timer is not None:
                    pick.timer.arm()  # the launch core records its events right around the launch
                done = launch(pick.arm.table.handle, grid, stream, args)
            except _core.RuntimeFailure as exc:
                session.failed(pick, exc)
                first = False
                continue
            finally:
                if pick.timer is not None:
                    pick.timer.disarm()
            if done is not True:
                raise RuntimeError(f"kernel {self.name}: internal error: the stub did not launch a candidate of "
                                   f"online tuning ({done!r})")
            return True

    def _settle_online(self, key: tuple, winner: Any) -> Any:
        """The session of `key` settled on `winner`: installed, so later calls launch it from C++."""
        self._core.install(list(key), winner)
        self._online.pop(key, None)
        return winner

    def _add_stub(self, args: tuple) -> Any:
        """The stub of this call's argument shape, added to the kernel's stubs."""
        return self._stub_for(args)

    def _bind_slow(self, args: tuple, kwargs: dict) -> tuple:
        """Binds by name; remembers a fast plan when the call names only parameters."""
        if self._needs_probe:
            self._record_heuristic_reads(self._bind(args, dict(kwargs))[:self._n_call])
        names = tuple(kwargs)
        out = self._bind(args, dict(kwargs))
        tail = [p.name for p in self.call_params[len(args):]]
        if (not self._python_heuristics and set(names) - set(tail) <= self._overwritten - self._kept_keywords
                and not self._option_params.intersection(names)):
            # Parameters after the positional ones: from kwargs, else their defaults.
            picks = tuple((n, n in kwargs, self.spec.param(n).default) for n in tail)
            if len(picks) == 1 and picks[0][1]:
                name = picks[0][0]
                plan = lambda a, kw: (*a, kw[name])  # noqa: E731  (the common BLOCK=... call)
            else:
                plan = lambda a, kw: (*a, *[kw[n] if given else d for n, given, d in picks])  # noqa: E731
            self._plans[(len(args), *names)] = plan
        return out

    def _unexpected(self, key: str) -> str:
        """Python's words for a keyword no parameter takes, with the parameter it is likely a typo of."""
        close = difflib.get_close_matches(key, [p.name for p in self.call_params if p.name != key], n=1, cutoff=0.6)
        return f"kernel {self.name}: unexpected keyword argument {key!r}" + (f" (did you mean {close[0]!r}?)"
                                                                             if close else "")

    def _bind(self, args: tuple, kwargs: dict) -> tuple:
        """Full positional call tuple: call parameters, then option kwargs and
        Python-evaluated heuristics as trailing pseudo-arguments."""
        if len(args) > self._n_call:
            raise TypeError(f"kernel {self.name}: takes {self._n_call} arguments "
                            f"({', '.join(p.name for p in self.call_params)}), got {len(args)}")
        values = list(args)
        options = {}
        for p in self.call_params[len(args):]:
            if p.name in kwargs:
                values.append(kwargs.pop(p.name))
                if p.name in self._option_params:
                    options[p.name] = values[-1]
            elif p.default is not _EMPTY:
                values.append(p.default)
            else:  # a keyword no parameter takes is likelier the cause (BLOK=256 for BLOCK)
                stray = [k for k in kwargs if k not in OPTION_NAMES and k not in self._config_sets
                         and k not in self._overwritten and all(k != q.name for q in self.call_params)]
                raise TypeError(self._unexpected(stray[0]) if stray else f"kernel {self.name}: missing argument "
                                f"{p.name!r}")
        for k in list(kwargs):
            if k in self._option_params:  # a call parameter, passed positionally already
                raise TypeError(f"kernel {self.name}: got multiple values for argument {k!r}")
            if k in self._config_sets:
                raise TypeError(f"kernel {self.name}: {self._config_sets[k]}; do not pass it (Triton refuses it too: "
                                "Conflicting meta-parameters)")
            if k in self._overwritten:
                if k not in self._kept_keywords:
                    del kwargs[k]  # overwritten by its heuristic, which does not read it
                continue
            if k not in OPTION_NAMES:
                raise TypeError(self._unexpected(k))
            specialize.check_option(k, kwargs[k], f"kernel {self.name}")
        for k, v in options.items():
            specialize.check_option(k, v, f"kernel {self.name}")
        kwargs.update(options)
        extra = ()
        # Compile options, and the values of keywords a heuristic overwrites (it reads them): one
        # interned token, so the stub keys it by identity; meta_kwargs gives them to the heuristics.
        if kwargs:
            opts = tuple(sorted(kwargs.items()))
            extra += (self._interned.setdefault(("options", opts), opts),)
        if self._python_heuristics:
            extra += (self._heuristics_token(values, kwargs),)
        return tuple(values) + extra

    def split_extras(self, args: tuple) -> tuple[dict, Any]:
        """(compile options, heuristics token) from the trailing pseudo-arguments."""
        extras = list(args[self._n_call:])
        token = extras.pop() if self._python_heuristics and extras else None
        options = dict(extras[0]) if extras else {}
        return options, token

    # -- stubs -----------------------------------------------------------------------

    def _stub_for(self, args: tuple):
        shape = self._shape(args)
        self._check_launchable(shape, args)
        with self._lock:
            # No compiler on this path: the table-driven stub serves until the
            # generated one is built in the background (stubgen.stub_now).
            stub = stubgen.stub_now(shape, lambda built: self._use_built_stub(shape, built), self.name)
            self._shapes[stub] = shape
            if stub not in self._stubs:
                self._stubs = (stub, *self._stubs)
        return stub

    def _use_built_stub(self, shape: Shape, built) -> None:
        """The generated stub replaces the table-driven one of its shape."""
        with self._lock:
            self._shapes[built] = shape
            self._stubs = tuple(built if self._shapes.get(s) == shape else s for s in self._stubs)

    def _record_heuristic_reads(self, args: tuple) -> None:
        self._needs_probe = False
        named = dict(zip((p.name for p in self.call_params), args))
        read: set[str] = set()
        recorders = []
        try:
            for layer in self.spec.heuristics:
                cfg_kwargs = self.spec.configs[0].all_kwargs() if (layer.inside_autotune and self.spec.configs) else {}
                for fn in layer.values.values():
                    rec = ReadRecorder({**named, **cfg_kwargs})
                    recorders.append(rec)
                    fn(rec)
                    read |= named.keys() if ReadRecorder.ALL in rec.read else rec.read & named.keys()
        except Exception:
            read = {n for n in named if specialize.holds_array(named[n])}
        seen = set().union(*(rec.read for rec in recorders))
        self._kept_keywords |= self._overwritten if ReadRecorder.ALL in seen else seen & self._overwritten
        if any(specialize.holds_array(named[n]) for n in read):
            log.debug("kernel %s: heuristics read arrays (%s): evaluated in Python on every call", self.name, read)
            self._python_heuristics = True
        else:
            self._heuristic_reads = read

    def _heuristics_token(self, values: list, options: dict) -> Any:
        named = dict(zip((p.name for p in self.call_params), values))
        out = []
        for cfg in self.spec.configs or [None]:
            out.append(tuple(sorted(self.meta_kwargs(cfg, named, options).items(), key=lambda kv: kv[0])))
        token = tuple(out)
        return self._interned.setdefault(repr(token), token)

    def _shape(self, args: tuple) -> Shape:
        """How the stubs read this call: one slot per argument, per leaf of a tuple argument
        (lazytriton.model.specialize decides each)."""
        keyed = set(self.spec.tune_keys) | (self._heuristic_reads or set())
        names, slots, paths, nodes = [], [], [], []
        for i, (p, v) in enumerate(zip(self.call_params, args)):
            flags = specialize.flags_of(p)
            if specialize.takes_tuple(flags, v):
                self._check_tuple_param(p, v, f"kernel {self.name}, argument {p.name}")
                nodes += [((i, *sub), n) for sub, n in tuples.nodes(v)]
                for sub, leaf in tuples.leaves(v):
                    name = tuples.leaf_name(p.name, sub)
                    names.append(name)
                    slots.append(specialize.slot_for(specialize.TUPLE_ELEMENT, leaf, p.name in keyed,
                                                     f"kernel {self.name}, argument {name}"))
                    paths.append((i, *sub))
                continue
            names.append(p.name)
            slots.append(specialize.slot_for(flags, v, p.name in keyed, f"kernel {self.name}, argument {p.name}"))
            paths.append((i,))
        for j, name in enumerate(self._extra_arg_names(args)):
            names.append(name)
            slots.append(Slot("constexpr"))
            paths.append((self._n_call + j,))
        if not nodes:
            return Shape(tuple(names), tuple(slots))
        arg_names = tuple(p.name for p in self.call_params[:len(args)]) + tuple(self._extra_arg_names(args))
        return Shape(tuple(names), tuple(slots), tuple(paths), arg_names, tuple(nodes))

    def _check_tuple_param(self, p, v: tuple, what: str) -> None:
        for sub, n in tuples.nodes(v):
            tuples.check_plain(tuples.at(v, sub), tuples.leaf_name(what, sub))
        for role in ("reset_to_zero", "restore_value"):
            if p.name in getattr(self.spec, role):
                raise TypeError(f"{what}: is a tuple, and {role} names it; Triton's autotuner cannot zero or restore "
                                "a tuple (it calls .zero_()/.copy_() on the argument): name array parameters only")

    def _extra_arg_names(self, args: tuple) -> list[str]:
        n = len(args) - self._n_call
        if n <= 0:
            return []
        return [f"__extra{i}__" for i in range(n)]  # never read by name

    def _check_launchable(self, shape: Shape, args: tuple) -> None:
        arrays = []
        for name, slot, v in zip(shape.names, shape.slots, shape.leaf_values(args)):
            what = f"kernel {self.name}, argument {name}"
            specialize.check_launchable(slot, v, what)
            if slot.kind == "ptr" and is_array(v):
                arrays.append((what, v, array_info(v, what).ptr))
            elif slot.kind == "desc":
                arrays.append((f"{what} (the descriptor's base)", v.base, tensor_desc.read(v, what).ptr))
        if arrays:
            self._check_devices(arrays)

    @staticmethod
    def _check_devices(arrays: list) -> None:
        """Refuses arrays the current device cannot read, before anything compiles or
        launches: a launch goes to the current device, and one that reads another
        device's memory faults and leaves the process's CUDA context unusable. The
        stubs apply the same rule in C (python_args.h) and hand such a call here."""
        ok, _ = _core.driver_status()
        if not ok:  # no driver: the launch says so
            return
        current = _core.current_device()
        for what, v, ptr in arrays:
            device = array_device(v)
            if ptr == 0 or device in (current, ANY_DEVICE) or _core.pointer_accessible(ptr):
                continue  # Triton's launcher check: it passes memory of a peer with peer access enabled
            if device is None:
                device = _core.pointer_device(ptr)
            if device < 0:
                raise ValueError(f"{what}: the memory at 0x{ptr:x} cannot be read by a kernel on the current device "
                                 f"(cuda:{current}): it is no device memory the driver knows (host memory?)")
            raise ValueError(
                f"{what}: the array is on cuda:{device}, but the current device is cuda:{current}, where the "
                "kernel would launch and cannot read it. Make its device current first (torch.cuda.set_device("
                f"{device}), `with torch.cuda.device({device}):`, cupy.cuda.Device({device}).use()), or move the "
                f"array to cuda:{current}")

    # -- resolution (first call of a specialization) ------------------------------------

    def outer_kwargs(self, named: dict, options: dict) -> dict:
        """The keywords triton.autotune receives: the call's (options, values a
        heuristic overwrites), then the values of heuristics outside it, in order."""
        kw = dict(options)
        for layer in self.spec.heuristics:
            if not layer.inside_autotune:
                for k, fn in layer.values.items():
                    kw[k] = fn({**named, **kw})
        return kw

    def meta_kwargs(self, cfg, named: dict, options: dict) -> dict:
        """Options, heuristic values and config meta-parameters for one config,
        in Triton's order (heuristics outside autotune do not see the config; a
        heuristic sees, and overwrites, a call's keyword of its name)."""
        kw = self.outer_kwargs(named, options)
        if cfg is not None:
            kw.update(cfg.all_kwargs())
        for layer in self.spec.heuristics:
            if layer.inside_autotune:
                for k, fn in layer.values.items():
                    kw[k] = fn({**named, **kw})
        return kw

    def binder(self, target) -> Binder:
        b = self._binders.get(target.arch)
        if b is None:
            b = self._binders[target.arch] = Binder(self.spec, target)
        return b

    def _resolve(self, key: tuple, ctx: tuple):
        """The winner of a new call key (once per key: see _first_call), with
        ctx = (call tuple, stream, grid, the stub that keyed it)."""
        args, stream, grid, stub = ctx
        try:
            capturing = _core.is_capturing(stream)
        except _core.RuntimeFailure as exc:  # no driver, a stream of another context: the call's error
            raise _core.RuntimeFailure(f"kernel {self.name}: {exc}") from None
        if not capturing:
            return self._resolution(key, args, stream, grid, self._shapes[stub], "tune")
        # Under capture (torch.cuda.graph, torch.compile's CUDA graphs): a persisted winner is loaded
        # and launched, which capture allows; anything else is refused before any work that would
        # invalidate the capture. The load is host work, relaxed for a capture in global mode.
        previous = _core.exchange_capture_mode(_core.CAPTURE_MODE_RELAXED)
        try:
            return self._resolution(key, args, stream, grid, self._shapes[stub], "record", CAPTURE_REMEDY_CALL)
        finally:
            _core.exchange_capture_mode(previous)

    def _resolution(self, key: tuple, args: tuple, stream: int, grid: Any, shape: Shape, mode: str,
                    capture_remedy: str = CAPTURE_REMEDY_JAX, per_call: bool = True):
        try:
            return Resolution(self, key, args, stream, grid, shape, mode, capture_remedy, per_call).run()
        except Exception as exc:
            if str(exc).startswith(f"kernel {self.name}"):
                raise
            try:  # same exception type, message naming the kernel, raised where the original was
                wrapped = type(exc)(f"kernel {self.name}: {exc}")
            except Exception:
                raise exc from None
            raise wrapped.with_traceback(exc.__traceback__) from None


_EMPTY = inspect.Parameter.empty
_ahead_pool = None


def _ahead():
    """Threads for compile_ahead: one per kernel being compiled ahead, so that
    every kernel's candidates reach the compile queue at once (the queue orders
    them and bounds the work; a thread only waits for its kernel's compiles and
    stores them). With a cap, the kernels past it reached the queue only as whole
    kernels ended. Idle threads are reused; the interpreter's exit waits for them."""
    global _ahead_pool
    if _ahead_pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _ahead_pool = ThreadPoolExecutor(max_workers=sys.maxsize, thread_name_prefix="lazytriton-compile-ahead")
    return _ahead_pool


def _after_fork() -> None:
    # A forked child has none of the pool's threads, while the pool counts its parent's idle
    # ones: its first job would wait for a thread that is not there.
    global _ahead_pool
    _ahead_pool = None


os.register_at_fork(after_in_child=_after_fork)


def config_keywords(spec: KernelSpec) -> dict[str, str]:
    """The keywords an autotuned kernel's configs set, each with why a call may
    not pass it: a meta-parameter of Config.kwargs, or a launch option that
    Config.all_kwargs() holds (what Triton's Autotuner.run passes besides the call's)."""
    out: dict[str, str] = {}
    for i, c in enumerate(spec.configs):
        for k, v in c.all_kwargs().items():
            if k in out:
                continue
            if k in c.kwargs:
                out[k] = f"{k!r} is chosen by its autotune configs (config {i} sets {k}={v!r})"
            else:
                out[k] = (f"{k}= is set by the autotune configs (config {i} has {k}={v!r}; a triton.Config sets "
                          "num_warps, num_stages and num_ctas unless given None, maxnreg and ir_override when given)")
    return out


def _every_call_refusal(spec: KernelSpec, config_sets: dict) -> str | None:
    """Why Triton refuses every call of this kernel, or None: a heuristic outside
    triton.autotune sets a keyword its configs set too (@triton.heuristics above
    @triton.autotune hands its values to the autotuner as the call's keywords)."""
    for layer in spec.heuristics:
        if not layer.inside_autotune:
            for k in layer.values:
                if k in config_sets:
                    return (f"kernel {spec.name}: its triton.heuristics, applied outside triton.autotune, sets {k}, "
                            "which its autotune configs set too: Triton refuses every call of such a kernel "
                            "(Conflicting meta-parameters). Put @triton.heuristics below @triton.autotune, or take "
                            f"{k} out of the configs")
    return None


def kernel(fn: Any = None, *, cache: Cache | None = None, tune_options: TuneOptions | None = None,
           tuning: str | None = None) -> LazyKernel:
    """Wrap a Triton kernel for lazy, tuned launches: `k = lazytriton.kernel(fn)`, then
    `k[grid](*args, stream=None, **kwargs)` or `k.run(*args, grid=, stream=None, **kwargs)`.

    fn: a @triton.jit (or Gluon @gluon.jit) function, under @triton.autotune and/or
    @triton.heuristics in either order. Nothing compiles here; the first call of each
    specialization compiles the candidate configs and tunes them on that call's arguments.
    Usable as a decorator too, above @triton.autotune: `@lazytriton.kernel()` or with the
    keywords below.
    cache: the lazytriton.cache.Cache winners are kept in, or its directory (default: the one
    of $LAZYTRITON_CACHE_DIR, ~/.cache/lazytriton).
    tune_options: a lazytriton.TuneOptions, how candidates are timed (its docstring).
    tuning: "first_call" (compile and time the candidates on the first call of each
    specialization), "online" (the first call waits for one compile and launches it; the calls
    that follow time one candidate each until the fastest is known: lazytriton.runtime.online),
    "off" (no timing: the first config), or None (default): LAZYTRITON_TUNING decides.
    """
    kw = {"cache": cache, "tune_options": tune_options, "tuning": tuning}
    if fn is None:
        return lambda f: LazyKernel(f, **kw)
    return LazyKernel(fn, **kw)
