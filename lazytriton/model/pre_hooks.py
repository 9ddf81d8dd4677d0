"""Config pre_hooks that only set tensor descriptors' block shapes.

Triton's idiom for autotuned kernels taking host TensorDescriptors (tutorial
09): each config's pre_hook sets the descriptors' block_shape from the
config's meta-parameters,

    def pre_hook(nargs):
        nargs["a_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]

Triton runs it before every launch. lazytriton launches from C++ with no
Python, so it runs such a hook once per config, when it resolves a call, on
stand-ins: descriptor arguments that record the block_shape set on them,
the config's meta-parameters, and the values the call key already pins
(constexpr arguments, autotune-key arguments). The block shapes it sets
become part of each candidate's compile (they are the `tensordesc<...>`
type) and so of the winner, whose CUtensorMap is encoded with them on every
launch. A hook that does anything else (reads an array or a value the call
key does not pin, writes anything but a descriptor's block_shape, sets none,
raises) is refused, as every other pre_hook is.
"""
from __future__ import annotations

from typing import Any, Callable

__all__ = ["HookRefused", "check", "blocks", "SetBlocks"]


class HookRefused(Exception):
    """A pre_hook that does more than set descriptors' block shapes; the
    message says what it did."""


class _Violation(Exception):
    pass


class _NeedsValue(Exception):
    """The hook uses a value known only per call (checked again then)."""


# Operations on a stand-in that use its value.
_VALUE_DUNDERS = (
    "__bool__", "__int__", "__float__", "__index__", "__complex__", "__len__", "__iter__", "__contains__",
    "__getitem__", "__setitem__", "__delitem__", "__call__", "__hash__", "__str__", "__repr__", "__format__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__neg__", "__pos__", "__abs__", "__invert__",
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
    "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__lshift__", "__rlshift__",
    "__rshift__", "__rrshift__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
    "__matmul__", "__rmatmul__", "__divmod__", "__rdivmod__", "__round__", "__trunc__", "__floor__", "__ceil__",
    "__enter__", "__exit__", "__reduce__", "__reduce_ex__", "__dir__", "__getstate__",
)


class _Arg:
    """A call argument as the hook sees it. kind: "desc" (a descriptor: only
    its block_shape may be set), "runtime" (wrap time: an argument the call key
    does not pin, which may be a descriptor), "later" (wrap time: a value the
    call key pins, known per call), "forbidden" (an array, or a scalar the call
    key does not pin)."""

    __slots__ = ("_lt_name", "_lt_kind", "_lt_block", "_lt_cls")

    def __init__(self, name: str, kind: str, cls: type | None = None):
        object.__setattr__(self, "_lt_name", name)
        object.__setattr__(self, "_lt_kind", kind)
        object.__setattr__(self, "_lt_block", None)
        object.__setattr__(self, "_lt_cls", cls)

    @property
    def __class__(self):
        # isinstance(nargs["desc_q"], TensorDescriptor) (tutorial 06's hook): an
        # argument's type is pinned by the call key (a descriptor or an array);
        # at wrap time it is not known yet.
        if self._lt_cls is None:
            raise _NeedsValue(self._lt_name)
        return self._lt_cls

    def _lt_use(self, what: str = "uses"):
        name, kind = self._lt_name, self._lt_kind
        if kind == "later":
            raise _NeedsValue(name)
        if kind == "desc":
            raise _Violation(f"{what} argument {name} (of a tensor descriptor, only the block_shape may be set)")
        if kind == "runtime":
            raise _Violation(f"{what} argument {name}, whose value the call key does not pin (a pre_hook may read "
                             "the config's meta-parameters, constexpr and autotune-key arguments, and set a "
                             "descriptor's block_shape)")
        raise _Violation(f"{what} argument {name}, whose value the call key does not pin"
                         if kind == "forbidden" else f"{what} argument {name}")

    def __setattr__(self, key: str, value: Any) -> None:
        name = self._lt_name
        if key != "block_shape":
            raise _Violation(f"sets {name}.{key}")
        if self._lt_kind == "forbidden":
            raise _Violation(f"sets block_shape on argument {name}, which is not a tensor descriptor")
        try:
            block = tuple(int(b) for b in value)
        except (TypeError, ValueError):
            raise _Violation(f"sets {name}.block_shape to {value!r}, not a sequence of ints") from None
        if not block or any(b < 1 or isinstance(b, bool) for b in block):
            raise _Violation(f"sets {name}.block_shape to {value!r}")
        object.__setattr__(self, "_lt_block", block)

    def __getattr__(self, key: str) -> Any:
        if key == "block_shape" and self._lt_block is not None:
            return list(self._lt_block)
        self._lt_use(f"reads .{key} of")

    def __delattr__(self, key: str) -> None:
        raise _Violation(f"deletes {self._lt_name}.{key}")


def _forbid(dunder: str):
    def method(self, *args, **kwargs):
        self._lt_use()
    method.__name__ = dunder
    return method


for _d in _VALUE_DUNDERS:
    setattr(_Arg, _d, _forbid(_d))


class _Nargs(dict):
    """The hook's nargs: reads are fine (the values are guarded), writes are not."""

    def _write(self, *args, **kwargs):
        raise _Violation("writes to nargs")

    __setitem__ = __delitem__ = pop = popitem = clear = update = setdefault = _write

    def __repr__(self):
        raise _Violation("formats nargs (every argument)")

    __str__ = __repr__


def _run(hook: Callable, nargs: _Nargs, args: dict[str, _Arg]) -> dict[str, tuple]:
    try:
        hook(nargs)
    except (_Violation, _NeedsValue):
        raise
    except Exception as exc:  # noqa: BLE001  (a hook that raises is refused, saying what it raised)
        raise _Violation(f"raises {type(exc).__name__}: {exc}") from exc
    out = {name: a._lt_block for name, a in args.items() if a._lt_block is not None}
    if not out:
        raise _Violation("sets no tensor descriptor's block_shape")
    return out


def _hook_name(hook: Any) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def check(spec) -> None:
    """Wrap time: raises HookRefused (with the config index) for a config
    pre_hook that certainly does more than set descriptors' block shapes.
    What depends on a call's values is checked again when it resolves."""
    pinned = {p.name for p in spec.params if p.is_constexpr} | set(spec.tune_keys) | spec.heuristic_names()
    for i, cfg in enumerate(spec.configs):
        hook = getattr(cfg, "pre_hook", None)
        if hook is None:
            continue
        meta = cfg.all_kwargs()
        # Values the call key pins may be used (checked per call); any other
        # argument may only get a block_shape (if it is a descriptor).
        args = {p.name: _Arg(p.name, "later" if p.name in pinned else "runtime")
                for p in spec.params if p.name not in meta}
        nargs = _Nargs({**args, **meta})
        try:
            _run(hook, nargs, args)
        except _NeedsValue:
            continue
        except _Violation as exc:
            raise HookRefused(i, str(exc)) from None


def blocks(spec, index: int, cfg, named: dict, meta: dict, descriptors: set[str],
           pinned: set[str] | None = None) -> dict[str, tuple]:
    """Resolution time: the block shape config `index`'s pre_hook sets on each
    descriptor argument (by name). `named`: the call's arguments; `meta`: the
    config's meta-parameters and compile options (and heuristics' values);
    `descriptors`: the arguments that are tensor descriptors; `pinned`: the
    arguments whose values the hook may read (default: constexpr and
    autotune-key arguments). HookRefused if the hook does anything else."""
    from .arrays import is_array
    from .tensor_desc import TritonTensorDescriptor, is_descriptor

    hook = cfg.pre_hook
    if pinned is None:
        pinned = {p.name for p in spec.params if p.is_constexpr} | set(spec.tune_keys)
    args: dict[str, _Arg] = {}
    values: dict[str, Any] = {}
    for name, v in named.items():
        if name in descriptors:  # a JAX descriptor passes isinstance(..., Triton's TensorDescriptor) too
            args[name] = _Arg(name, "desc", type(v) if is_descriptor(v) else TritonTensorDescriptor)
        elif name in pinned and not is_array(v):
            values[name] = v
        else:
            args[name] = _Arg(name, "forbidden", type(v))
    nargs = _Nargs({**args, **values, **meta, **cfg.all_kwargs()})
    try:
        return _run(hook, nargs, args)
    except _NeedsValue as exc:  # cannot happen: no "later" stand-ins here
        raise HookRefused(index, f"uses argument {exc}") from None
    except _Violation as exc:
        raise HookRefused(index, str(exc)) from None


class SetBlocks:
    """A pre_hook that sets fixed block shapes: what a JAX call site records
    (the hook ran at trace time) for the handler's resolution to replay."""

    def __init__(self, blocks: dict[str, list]):
        self.blocks = {k: list(v) for k, v in blocks.items()}

    def __call__(self, nargs):
        for name, block in self.blocks.items():
            nargs[name].block_shape = list(block)

    def __repr__(self):
        return f"SetBlocks({self.blocks})"
