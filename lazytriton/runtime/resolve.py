"""Resolving a call key: the first call of a specialization.

The persistent cache's winner if there is one (no compile, no tuning); else
compile the candidates (every config of an autotuned kernel) and tune them on
this call's very arguments, persist the winner, and hand the C++ table an
Entry to launch. With jax.distributed, one process resolves and the others
adopt its winner (lazytriton.distributed).
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Protocol

from .. import _core, distributed
from ..cache import (BadEntry, Cache, TuningRecord, decode_binary, encode_binary, keys, measurements, settings,
                     verdicts)
from ..compile import schedule
from ..compile.compiler import AllCandidatesFailed, Candidate, compile_all, compile_stream
from ..compile.targets import device_target
from ..model import pre_hooks, tensor_desc, tuples
from ..model.arrays import PointerArg, array_info, is_array
from ..model.spec import KernelSpecError, as_read_now, pre_hook_refusal
from ..model.specialize import OPTION_NAMES, Shape
from ..settings import isolation as isolation_enabled
from . import online
from .isolation import Isolation, failed_error, prestart
from .tuner import TuneOptions, tune, writes


class Resolvable(Protocol):
    """What a Resolution reads of the kernel it resolves for
    (runtime.kernel.LazyKernel, which imports this module to make them)."""

    name: str
    spec: Any
    cache: Cache
    records: Any
    loaded_kernels: Any
    tune_options: Any
    scratch_args: Any
    call_params: Any
    meta_kwargs: Any
    n_call: int
    tuning_mode: str  # "first_call", "online" or "off": this kernel's, LAZYTRITON_TUNING's when it says none

    def outer_kwargs(self, named: dict, options: dict) -> dict: ...

    def split_extras(self, args: tuple) -> tuple[dict, Any]: ...

    def binder(self, target: Any) -> Any: ...

log = logging.getLogger("lazytriton")

_stats = {"compiles": 0, "tunes": 0, "record_hits": 0, "resolves": 0, "timed": 0, "measured_before": 0}
_timings: list[dict] = []


def counters() -> dict:
    """Python-side work of this process: compiles, tunes, cached winners used, resolutions,
    configs timed, and configs whose time measured in an earlier process was used instead."""
    return dict(_stats)


def timings() -> list[dict]:
    """Per compile-and-tune resolution of this process: kernel, candidates,
    compiled_s (when the last candidate was ready), front_end_s (Triton's front
    end in this process, summed over candidates), compile_s (every
    candidate's front end and back end, summed: CPU seconds, about), in_threads (candidates
    compiled on threads here: the compile server was not ready), front_ends_here
    (candidates whose front end ran in this process: all of them, since issue 47), isolated_s
    (first launches isolated in the helper process, summed), tuned_s (compile and tune,
    overlapped), tune_s (the tune alone: seconds in trials, re-timing and the last restore,
    whether or not compiles ran between them), at
    (time.perf_counter() when it ended).
    For benchmarks."""
    return list(_timings)


class CaptureError(RuntimeError):
    """A kernel with no tuned winner was first called while its stream was
    being captured into a CUDA graph."""


# What a capture that meets a kernel with no winner should do instead, per face.
CAPTURE_REMEDY_JAX = ("Run the function once with command buffers off (XLA_FLAGS=--xla_gpu_enable_command_buffer=) "
                      "or with jax >= 0.10.2, which executes once before capturing; or set "
                      "LAZYTRITON_CAPTURE_FALLBACK=first_config to launch the first config untuned")
CAPTURE_REMEDY_CALL = ("Call the kernel once with these arguments before capturing (PyTorch's documented warm-up "
                       "before torch.cuda.graph), or use a cache that holds its winner; the capture was left "
                       "as it was")


@dataclass(frozen=True)
class Resolved:
    """A call's winner, resolved but not launched."""
    entry: Any  # _core.Entry: .kernel (cubin, metadata), .is_param, .meta
    names: list  # the kernel's call arguments, in order
    args: tuple  # their values in this call
    # Each leaf's kernel parameter type ("*fp16", "i32", "fp32", "u1") or "constexpr": one per
    # argument, a tuple argument one per element (depth first; lazytriton.model.tuples), as entry.is_param.
    types: list
    meta: dict  # the winner's meta-parameters (what a grid callable sees besides the arguments)
    grid: tuple | None  # (x, y, z) when a grid was given
    key: tuple  # the call key: the specialization this winner serves
    leaf_names: list | None = None  # per entry of `types`: "n", or "xs[1][0]" in a tuple argument
    # Per entry of `types`: its row of the call's slot table (specialize.Shape.table()), as the stubs read it.
    table: list | None = None
    # Online tuning, still deciding: this call's candidate, not the winner; its launch is timed by this
    # _core.LaunchTimer (None: launched untimed) and its entry must not be installed.
    timer: Any = None
    this_call_only: bool = False

    @property
    def kernel(self):
        return self.entry.kernel


class Resolution:
    """Resolving one call key: cached winner, else compile + tune on these args."""

    def __init__(self, k: Resolvable, key: tuple, args: tuple, stream: int, grid: Any, shape: Shape,
                 mode: str = "tune", capture_remedy: str = CAPTURE_REMEDY_JAX, per_call: bool = True):
        self.k, self.key, self.stream, self.grid, self.shape, self.mode = k, key, stream, grid, shape, mode
        self.per_call = per_call  # the caller asks again on each call (k[grid], the JAX handler): online tuning may apply
        self.capture_remedy = capture_remedy
        self.spec = k.spec
        self.device = None  # run() asks the driver
        self.dev: dict | None = None  # and its description (name, capability, driver version)
        self.values = args[:k.n_call]
        self.extras = args[k.n_call:]
        self.names = [p.name for p in k.call_params]
        self.named = dict(zip(self.names, self.values))
        # Leaves: an argument, or each element of a tuple argument (lazytriton.model.tuples).
        # Tuning, kernel parameters and written buffers are per leaf.
        n_leaves = shape.call_leaves(k.n_call)
        self.leaf_names = list(shape.names[:n_leaves])
        self.leaf_values = tuple(shape.leaf_values(args)[:n_leaves])
        self.arrays = {}
        self.descs: dict[str, tensor_desc.DescInfo] = {}  # host tensor descriptor leaves
        for name, v in zip(self.leaf_names, self.leaf_values):
            if is_array(v):
                info = array_info(v, f"kernel {k.name}, argument {name}")
                self.arrays[name] = (info.ptr, info.nbytes)  # nbytes None: unknown (the allocation's extent)
            elif tensor_desc.is_descriptor(v):
                d = self.descs[name] = tensor_desc.read(v, f"kernel {k.name}, argument {name}")
                self.arrays[name] = (d.ptr, d.nbytes)  # its base: what a trial may write

        def bind_value(v):
            if is_array(v):
                info = array_info(v)
                return PointerArg(info.ptr, info.dtype)
            if tensor_desc.is_descriptor(v):  # what Triton's binder sees: its dtype and block shape
                return tensor_desc.bind_value(tensor_desc.read(v, "a tensor descriptor"))
            return v

        self.bind_values = tuple(tuples.map_leaves(v, bind_value) for v in self.values)
        self.options, _ = k.split_extras(args)

    def run(self):
        # A call: it gets the GIL back sooner from front ends made ahead, and its keys read the
        # kernel's state once (each key read it again: 1-2 ms of a first call's own work).
        with schedule.resolving(), keys.one_reading():
            return self._run()

    def _run(self):
        _stats["resolves"] += 1
        k = self.k
        self.device = _core.current_device()
        dev = _core.device_info(self.device)
        self.dev = dev
        self.target = device_target(dev)
        # The stub's shape and call key pin the specialization exactly (dtypes,
        # alignment, ==1, %16, key values), so a cached winner is found without
        # running Triton's binder (whose first use can import torch: seconds).
        shape_sig = {n: sl.code() for n, sl in zip(self.shape.names, self.shape.slots)}
        if not self.shape.flat:  # tuple arguments: their nesting too (an empty tuple has no slot)
            shape_sig["(tuples)"] = [[list(p), n] for p, n in self.shape.tuples]
        self.shape_sig = shape_sig  # the specialization, for the measurements' key too
        self.portable_key = self.shape.portable_key(tuple(self.key), self.values + self.extras)
        tkey = keys.tuning_key(self.spec.fn, shape_sig, {}, {}, self.spec.configs, self.options, self.target,
                               dev["name"], self.portable_key, dev["driver_version"])
        cache, st = k.cache, settings()
        agreement = distributed.agreement() if self.mode == "tune" else None
        if agreement is not None and self.online():  # every process tunes; the first decision wins everywhere
            return self._online_agreed(agreement, cache, tkey, st)
        if agreement is not None:  # many processes (jax.distributed): one resolves, all launch its winner
            return agreement.resolve(k.name, tkey, lambda: self._shared(cache, self._here(cache, tkey, st)),
                                     lambda rec, origin, binary: self._adopt(cache, tkey, rec, origin, binary),
                                     cached=lambda: self._cached(cache, tkey, st))
        return self._here(cache, tkey, st)

    def _cached(self, cache: Cache, tkey: str, st):
        """The cached winner for agreement to publish, or None (no compile)."""
        if st.retune:
            return None
        with cache.lock(tkey):
            hit = self._from_record(cache, cache.load_record(tkey, self._expect()))
        return None if hit is None else self._shared(cache, hit)

    def _shared(self, cache: Cache, entry):
        """(entry, record, winner's binary) for agreement to publish."""
        binary = cache.load_binary(self.record.winner)
        return entry, self.record.to_dict(), None if binary is None else encode_binary(self.record.winner, binary)

    def _adopt(self, cache: Cache, tkey: str, rec: dict, origin: dict, binary: bytes | None):
        """Launch another process's winner; its binary, when it came along and is
        what this process would compile (same compile key), goes into the cache first."""
        cands = self._candidates()
        if binary is not None and self.compile_key(cands[rec["winner_index"]]) == rec.get("winner"):
            try:
                cache.store_binary(rec["winner"], decode_binary(rec["winner"], binary))
            except BadEntry as exc:  # then it compiles here
                log.warning("kernel %s: the winner's binary from rank %s is unusable (%s); compiling it here",
                            self.k.name, origin.get("rank"), exc)
        return self.entry_of(self._tune(cache, tkey, cands, True, agreed=(rec, origin)))

    def _here(self, cache: Cache, tkey: str, st):
        """Resolve as a lone process: the cached winner, else compile and tune."""
        k = self.k
        with cache.lock(tkey):
            hit = None if st.retune else self._from_record(cache, cache.load_record(tkey, self._expect()))
            if hit is not None:
                return hit
            if self.mode == "record":
                raise CaptureError(
                    f"kernel {k.name}: its first call for these arguments is being captured into a CUDA graph (its "
                    "stream is capturing) and no winner is persisted for it, and lazytriton never compiles or tunes "
                    f"under capture. {self.capture_remedy}")
            if self.mode == "first":
                return self.entry_of(self._first(self._candidates()))
            cands = self._candidates()
            if self.online() and len(self._pruned(cands)) > 1:  # a lone candidate has nothing to tune
                return self._online_session(cache, tkey, st, cands)
            return self.entry_of(self._tune(cache, tkey, cands, st.tuning))

    def online(self) -> bool:
        """Whether this resolution tunes online (runtime/online.py) rather than on this call."""
        return self.mode == "tune" and self.per_call and self.k.tuning_mode == "online"

    def _online_session(self, cache: Cache, tkey: str, st, cands: list[Candidate],
                        agreement=None) -> "online.Session":
        """Online tuning: every candidate queued, the likeliest winner first; the session
        launches the first ready on this call, then one candidate per call that follows."""
        session = online.Session(self, cache, tkey, cands, self._pruned(cands),
                                 TuneOptions.given(self.k.tune_options, f"kernel {self.k.name}").online_samples,
                                 fresh=st.retune, agreement=agreement)
        self._forget_arguments()
        return session

    def _online_agreed(self, agreement, cache: Cache, tkey: str, st):
        """Online tuning in a job of many processes: a winner the job published already is
        launched at once; a cached one is published; else this process tunes online too, and
        the first decision published is the one every process launches (online.Session.decide)."""
        published = agreement.published(self.k.name, tkey)
        if published is not None:
            return self._adopt(cache, tkey, *published)
        hit = self._cached(cache, tkey, st)
        if hit is not None:
            return agreement.decide(self.k.name, tkey, hit,
                                    lambda rec, origin, binary: self._adopt(cache, tkey, rec, origin, binary),
                                    cached=True)
        with cache.lock(tkey):
            cands = self._candidates()
            if len(self._pruned(cands)) > 1:
                return self._online_session(cache, tkey, st, cands, agreement)
        # A lone candidate: nothing to tune online; agreed on as by a first call that tunes.
        return agreement.resolve(self.k.name, tkey, lambda: self._shared(cache, self._here(cache, tkey, st)),
                                 lambda rec, origin, binary: self._adopt(cache, tkey, rec, origin, binary))

    def _forget_arguments(self) -> None:
        """Drops this call's argument objects (a session outlives its first call: the
        caller's arrays must not be kept alive by it); addresses and sizes stay."""
        self.values = self.leaf_values = self.bind_values = None
        self.named = {}

    def _expect(self) -> dict:
        """What a tuning record from the remote tier must say to be for this device."""
        return {"device_name": self.dev["name"], "driver_version": self.dev["driver_version"]}

    def _candidates(self) -> list[Candidate]:
        binder = self.k.binder(self.target)
        cands = []
        for i, cfg in enumerate(self.spec.configs or [None]):
            meta = self.k.meta_kwargs(cfg, self.named, self.options)
            # By name: a parameter its configs set may sit between call parameters
            # (softmax(x, y, n, ROWS, BLOCK) with ROWS in the configs).
            values = dict(zip(self.names, self.bind_values))
            blocks = self._hook_blocks(i, cfg, meta)
            for name, block in blocks.items():  # the config's block shapes are the descriptors' types
                values[name] = tensor_desc.bind_value(self.descs[name], block)
            # A call parameter named like a launch option is one only when the call passed it by keyword.
            positional = frozenset(n for n in self.names if n in OPTION_NAMES and n not in meta)
            c = Candidate(i, cfg, binder.bind((), {**values, **meta}, positional))
            # The grid's meta: Triton's bound arguments, where a parameter may be named like an option.
            c.extra["meta"] = {kk: vv for kk, vv in meta.items() if kk not in OPTION_NAMES or kk in self.spec.arg_names}
            if blocks:
                c.extra["desc_blocks"] = {n: list(b) for n, b in blocks.items()}
            cands.append(c)
        return cands

    def _hook_blocks(self, i: int, cfg, meta: dict) -> dict:
        """The block shape config i's pre_hook sets per descriptor argument (pre_hooks.py)."""
        if cfg is None or getattr(cfg, "pre_hook", None) is None:
            return {}
        try:
            blocks = pre_hooks.blocks(self.spec, i, cfg, self.named, meta, set(self.descs))
        except pre_hooks.HookRefused as exc:
            raise pre_hook_refusal(self.k.name, self.spec.configs, *exc.args) from None
        for name, block in blocks.items():
            if len(block) != self.descs[name].rank:
                raise KernelSpecError(f"kernel {self.k.name}: config {i}'s pre_hook sets {name}.block_shape to "
                                      f"{list(block)}, but the descriptor has rank {self.descs[name].rank}")
        return blocks

    def compile_key(self, c: Candidate) -> str:
        """The candidate's key in the cache (its binary, its verdict, its line in the record)."""
        # Once per candidate (a resolution asks up to four times): the key reads the kernel's
        # globals as they are now, and one call looks up and stores under the same key.
        if "compile_key" not in c.extra:
            b = c.bound
            # extern_libs holds absolute install paths: leaving them out lets a bundle
            # move between machines (the Triton version in the key pins libdevice).
            opts = {kk: vv for kk, vv in b.options.__dict__.items() if kk != "extern_libs"}
            c.extra["compile_key"] = keys.compile_key(self.spec.fn, b.signature, b.constexprs, b.attrs, opts,
                                                      self.target)
        return c.extra["compile_key"]

    def _first(self, cands: list[Candidate]) -> Candidate:
        """The first config that compiles, untuned and not persisted."""
        compile_all(self.spec, self.target, cands[:1])
        if cands[0].binary is None:
            raise AllCandidatesFailed(self.k.name, cands[:1])
        log.warning("kernel %s: launching config 0 untuned (LAZYTRITON_CAPTURE_FALLBACK)", self.k.name)
        return cands[0]

    def _from_record(self, cache: Cache, rec: TuningRecord | None):
        launch = rec.extra.get("launch") if rec is not None else None
        if not launch:
            return None
        binary = cache.load_binary(rec.winner)
        if binary is None:
            return None
        _stats["record_hits"] += 1
        log.info("kernel %s: using the tuned winner (config %d) from %s: no compile, no tuning",
                 self.k.name, rec.winner_index, rec.origin)
        self.k.records.append(rec)
        self.record = rec
        return self._make_entry(rec.winner, binary, launch["is_param"], launch["meta"])

    def _pruned(self, cands: list[Candidate]) -> list[Candidate]:
        """The candidates the configs' early_config_prune keeps."""
        if not (self.spec.autotuned and len(cands) > 1):
            return cands
        # Triton's prune_configs gets the keywords the autotuner got: the call's, the outer heuristics'.
        kept = self.spec.prune([c.config for c in cands], self.named, self.k.outer_kwargs(self.named, self.options))
        pruned = [c for c in cands if any(c.config is kc for kc in kept)]
        if len(pruned) < len(cands):
            log.info("kernel %s: pruned to %d of %d configs", self.k.name, len(pruned), len(cands))
        return pruned

    def load_cached(self, cache: Cache, cands: list[Candidate]) -> list[Candidate]:
        """The candidates whose binaries the cache holds, loaded now (the others keep no binary)."""
        for c in cands:
            c.binary = cache.load_binary(self.compile_key(c))
        return [c for c in cands if c.binary is not None]

    def compile_candidates(self, cache: Cache, cands: list[Candidate], background: bool = False,
                           order: int | None = None, in_order: bool = False,
                           soon: bool = False, fn: Any = None) -> Iterator[Candidate]:
        """compile_stream over the cache: binaries found there are not compiled,
        those compiled are stored, and a candidate another thread of this
        process is compiling already (compile_ahead, a first call of another
        key) is waited for, not compiled twice. `fn`: the kernel as read at the
        call (`as_read_now`), for streams of one call; made now by default."""
        def store(c, binary):
            _stats["compiles"] += 1
            if self.leaf_names is not None:  # read here: off a first call's path when compiled ahead
                writes(binary, c.bound, self.leaf_names)
            cache.store_binary(self.compile_key(c), binary)

        for c in cands:  # keyed now, on this call's reading of the kernel (keys.one_reading)
            self.compile_key(c)
        # The front ends read the kernel as it is now too, wherever and whenever they run.
        return compile_stream(self.spec, self.target, cands, load=lambda c: cache.load_binary(self.compile_key(c)),
                              store=store, key=self.compile_key, ahead=background,
                              order=order, in_order=in_order, soon=soon,
                              fn=as_read_now(self.spec.fn) if fn is None else fn)

    def compile_ahead(self, target, order: int | None = None, soon: bool = False) -> int:
        """Compiles every candidate of this specialization for `target` and
        persists the binaries, tuning nothing and launching nothing: a later
        first call of it finds them (or waits for those still compiling).
        Returns how many compiled."""
        self.target = target
        cands = self._pruned(self._candidates())
        if not settings().tuning:
            cands = cands[:1]
        # No first call waits on these: they wait for the compile server rather than
        # compiling on threads of this process beside the program's own work.
        with keys.one_reading():
            ready = self.compile_candidates(self.k.cache, cands, background=True, order=order, soon=soon)
        if len(cands) > 1:
            self._prestart_isolation(cands)
        done = list(ready)
        if done and all(c.binary is None for c in done):  # result() raises, naming each error, as a call would
            raise AllCandidatesFailed(self.k.name, done)
        return sum(1 for c in done if c.binary is not None)

    def _tune(self, cache: Cache, tkey: str, cands: list[Candidate], tuning: bool, agreed=None) -> Candidate:
        k = self.k
        if agreed is not None:  # (record, origin) of another process's winner: that config alone, no trials
            pruned = [cands[agreed[0]["winner_index"]]]
        else:
            pruned = self._pruned(cands)
        untuned = not tuning and len(pruned) > 1
        if not tuning:
            pruned = pruned[:1]
        # Configs measured before (an earlier process, another host through the remote tier):
        # only the others are compiled and timed; the winner is chosen among all.
        mkey, prior = self._measured_before(cache, pruned, agreed is None and tuning)
        todo = [c for c in pruned if c.index not in prior]
        # Configs whose binary faulted or hung in an earlier isolated first launch: not compiled,
        # never launched (lazytriton.cache.verdicts).
        docs = [verdicts.lookup(cache, self.compile_key(c)) for c in todo]
        failed = self._failed_before(todo, docs)
        kept = [(c, doc) for c, doc in zip(todo, docs) if not any(c is f for f in failed)]
        todo = [c for c, _ in kept]
        isolation = self._isolation(cache, [doc for _, doc in kept])
        # Trials start as soon as two candidates are compiled, while the others
        # still compile (tune() reads the stream).
        t0 = time.perf_counter()
        ready = self.compile_candidates(cache, todo)
        winner = None
        with contextlib.closing(ready):
            try:
                winner = tune(k.name, ready, self.leaf_names, self.leaf_values, self.arrays,
                              list(self.shape.table()[:len(self.leaf_names)]), self._grid_of,
                              self.stream, self.device, self.spec.reset_to_zero, self.spec.restore_value,
                              k.tune_options, scratch=k.scratch_args, time_alone=bool(prior),
                              isolation=isolation) if todo else None
            except AllCandidatesFailed as exc:
                if not prior:
                    raise AllCandidatesFailed(k.name, sorted([*failed, *exc.candidates],
                                                             key=lambda c: c.index)) from None
        if winner is None and not prior:
            raise AllCandidatesFailed(k.name, failed)
        if prior:
            winner = self._best_with_prior(cache, winner, pruned, todo, prior)
        timed = [c for c in todo if c.extra.get("time_ms") is not None]
        _stats["timed"] += len(timed)
        _stats["measured_before"] += len(prior)
        _stats["tunes"] += int(len(todo) > 1 or bool(prior and timed))
        if mkey is not None and timed:
            measurements.record(cache, mkey, k.name, {
                measurements.config_id(c.config): {"config": keys.config_parts(c.config) if c.config else {},
                                                   "time_ms": c.extra["time_ms"], "compile_key": self.compile_key(c)}
                for c in timed}, family=self.family())
        _timings.append({"kernel": k.name, "candidates": len(pruned),
                         "compiled_s": max((c.extra.get("ready_s", 0.0) for c in pruned), default=0.0),
                         "front_end_s": sum(c.extra.get("front_end_s", 0.0) for c in pruned),
                         "compile_s": sum(c.compile_s for c in pruned),
                         "in_threads": sum(c.extra.get("compiled_in") == "thread" for c in pruned),
                         "front_ends_here": sum(c.extra.get("front_end") == "here" for c in pruned),
                         "isolated_s": sum(c.extra.get("isolated_s", 0.0) for c in pruned),
                         "tuned_s": time.perf_counter() - t0,
                         "tune_s": winner.extra.get("tune_s", 0.0) if winner is not None else 0.0,
                         "at": time.perf_counter()})
        self.store_record(cache, tkey, cands, winner,
                          {c.index: prior.get(c.index, c.extra.get("time_ms")) for c in cands},
                          {c.index: {"measured_before": True} for c in cands if c.index in prior},
                          agreed=agreed, untuned=untuned)
        return winner

    def family(self) -> str:
        """This kernel's measurements family on this device (measurements.family_key)."""
        return measurements.family_key(self.spec.fn, self.target, self.dev["name"], self.dev["driver_version"])

    def store_record(self, cache: Cache, tkey: str, cands: list[Candidate], winner: Candidate, times: dict,
                     notes: dict, agreed=None, untuned: bool = False, extra: dict | None = None):
        """Persists `winner` as this key's tuning record: each candidate's time (`times` by
        index; `notes`: more fields of a candidate's line), the winner's launch info."""
        rec = TuningRecord(
            kernel_name=self.k.name, winner=self.compile_key(winner), winner_index=winner.index,
            candidates=[{"config": keys.config_parts(c.config) if c.config is not None else {},
                         "compile_key": self.compile_key(c) if c.binary is not None else None,
                         "time_ms": times.get(c.index), "error": c.error, **notes.get(c.index, {})} for c in cands],
            device_name=self.dev["name"], compute_capability=list(self.dev["capability"]),
            driver_version=self.dev["driver_version"],
            tune_key_values=keys.canonical(list(self.portable_key)),
            extra={"launch": self._launch_info(winner)} if _jsonable_meta(winner.extra["meta"]) else {})
        rec.extra.update(extra or {})
        if agreed is not None:
            rec.extra["agreed"] = distributed.provenance(*agreed, rec.winner)
        if untuned:  # chosen without timing (LAZYTRITON_TUNING=off): never published to the remote tier
            rec.extra["untuned"] = True
        cache.store_record(tkey, rec)
        self.k.records.append(rec)
        self.record = rec
        return rec

    def _failed_before(self, cands: list[Candidate], docs: list[dict | None]) -> list[Candidate]:
        """Of these candidates (docs: each one's verdict, by compile key: known before compiling), those
        whose binary faulted or hung in an isolated first launch of this or an earlier process, each
        given its error. LAZYTRITON_RETUNE=1 tries them again."""
        if settings().retune:
            return []
        failed = []
        for c, doc in zip(cands, docs):
            if verdicts.failed(doc):
                c.error = failed_error(doc)
                failed.append(c)
                log.warning("kernel %s: %s skipped: it %s", self.k.name, c.label, c.error)
        return failed

    def _prestart_isolation(self, cands: list[Candidate]) -> None:
        """Compiling ahead for this process's own CUDA device, candidates with no verdict yet: the
        first call will run each once in the isolation helper, so the helper starts now, beside
        the compiles, not on that call (a program of many kernels: on its first kernel's)."""
        if not (isolation_enabled() and settings().tuning):
            return
        try:
            device = _core.current_device()
            dev = _core.device_info(device)
        except _core.RuntimeFailure:  # no GPU here: compiling for another machine
            return
        if dev.get("backend") != "cuda" or device_target(dev) != self.target:
            return
        if any(verdicts.lookup(self.k.cache, self.compile_key(c)) is None for c in cands):
            prestart(device)

    def _isolation(self, cache: Cache, docs: list[dict | None]) -> Isolation | None:
        """This tune's isolation of first launches (LAZYTRITON_ISOLATION) for candidates with these
        verdicts, its helper started now when one is not proven yet, so that its start overlaps the
        compiles."""
        # CUDA only: the HIP layer has no IPC entries, and nothing of this has run on an AMD GPU yet.
        if not isolation_enabled() or not docs or self.dev is None or self.dev.get("backend") != "cuda":
            return None
        if any(doc is None or doc["verdict"] != verdicts.OK for doc in docs):
            prestart(self.device)
        return Isolation(cache, self.k.name, self.device, self.dev["name"], self.compile_key)

    def _measured_before(self, cache: Cache, pruned: list[Candidate], timing: bool) -> tuple[str | None, dict]:
        """(the measurements' key, {candidate index: time_ms measured before}) for a tune of
        several configs; (None, {}) otherwise. LAZYTRITON_RETUNE=1 measures every config again."""
        if not (timing and len(pruned) > 1) or self.dev is None:  # (no device asked: nothing to compare with)
            return None, {}
        k = self.k
        mkey = measurements.measure_key(self.spec.fn, self.shape_sig, self.options, self.target, self.dev["name"],
                                        self.portable_key, self.dev["driver_version"], k.tune_options)
        if settings().retune:
            return mkey, {}
        ids = {c.index: measurements.config_id(c.config) for c in pruned}
        found = measurements.lookup(cache, mkey, k.name, list(ids.values()))
        prior = {i: found[cid]["time_ms"] for i, cid in ids.items() if cid in found}
        if prior:
            log.info("kernel %s: %d of %d configs were measured before on this GPU model for this specialization "
                     "(configs %s); compiling and timing only the other %d%s, then choosing among all", k.name,
                     len(prior), len(pruned), ", ".join(map(str, sorted(prior))), len(pruned) - len(prior),
                     f" (configs {', '.join(str(c.index) for c in pruned if c.index not in prior)})"
                     if len(prior) < len(pruned) else "")
        return mkey, prior

    def _best_with_prior(self, cache: Cache, winner: Candidate | None, pruned: list[Candidate],
                         todo: list[Candidate], prior: dict) -> Candidate:
        """The fastest of this tune's winner and the configs measured before; a config measured
        before that wins is loaded from the cache (local or remote), else compiled alone."""
        cands = {c.index: c for c in pruned}
        best_i = min(prior, key=lambda i: (prior[i], i))
        if winner is not None and (winner.extra.get("time_ms") is None
                                   or (winner.extra["time_ms"], winner.index) < (prior[best_i], best_i)):
            return winner
        best = cands[best_i]
        best.extra["time_ms"] = prior[best_i]
        ready = self.compile_candidates(cache, [best])
        with contextlib.closing(ready):
            for _ in ready:
                pass
        if best.binary is None:
            if winner is None:
                raise AllCandidatesFailed(self.k.name, [best, *todo])
            log.warning("kernel %s: config %d, measured before as the fastest, does not compile now (%s); using "
                        "config %d", self.k.name, best_i, best.error, winner.index)
            return winner
        log.info("kernel %s: winner config %d at %.4f ms, measured before (%s)", self.k.name, best_i, prior[best_i],
                 ", ".join(f"{i}: {t:.4f}" for i, t in sorted(
                     {**prior, **{c.index: c.extra["time_ms"] for c in todo if c.extra.get("time_ms")}}.items())))
        return best

    def _grid_of(self, c: Candidate):
        if self.grid is None:
            raise ValueError(f"kernel {self.k.name}: a grid is needed to tune it on this call")
        if callable(self.grid):
            return self.grid({**self.named, **c.extra["meta"]})
        return self.grid

    def _launch_info(self, c: Candidate) -> dict:
        """What a later process needs to launch the winner: which call arguments
        are kernel parameters, and the meta-parameters a grid callable sees."""
        flat = c.bound.flat_signature
        info = {"is_param": c.bound.is_param(self.leaf_names) + [False] * len(self.extras),
                "meta": dict(c.extra["meta"])}
        if self.descs:  # each descriptor's compiled type (the block shape a pre_hook chose is in it)
            info["descriptors"] = {n: flat.get(n) for n in self.descs}
        return info

    def entry_of(self, c: Candidate):
        info = self._launch_info(c)
        return self._make_entry(self.compile_key(c), c.binary, info["is_param"], info["meta"])

    def _make_entry(self, ckey: str, binary, is_param: list, meta: dict):
        # A slot the stub reads as a constexpr packs nothing: a winner that takes a kernel
        # parameter there was compiled for another specialization than this shape's.
        for name, slot, p in zip(self.leaf_names, self.shape.slots, is_param):
            if p and slot.kind == "constexpr":
                raise RuntimeError(f"kernel {self.k.name}, argument {name}: internal error: the winner takes it "
                                   "as a kernel parameter, but this call's argument shape holds it as a constexpr")
        kern = self.k.loaded_kernels.get(ckey)
        if kern is None:
            kern = self.k.loaded_kernels[ckey] = _core.Kernel(binary.cubin, binary.metadata)
        kern.load()
        return _core.Entry(kern, list(is_param), dict(meta))


def _jsonable_meta(meta: dict) -> bool:
    return all(isinstance(v, (int, float, bool, str, type(None))) for v in meta.values())
