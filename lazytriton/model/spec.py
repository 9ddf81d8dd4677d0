"""What a kernel is: the @triton.jit (or Gluon @gluon.jit) function under any
autotune/heuristics wrappers, its parameters, candidate configs and tuning rules."""
from __future__ import annotations

import ast
import copy
import dataclasses
import functools
import importlib
import inspect
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import triton
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction

from . import pre_hooks
from .specialize import OPTION_NAMES, check_option


class KernelSpecError(ValueError):
    """A kernel description lazytriton cannot run; the message names the kernel."""


class PreHookRefused(KernelSpecError, NotImplementedError):
    """A config pre_hook that does more than set tensor descriptors' block
    shapes (pre_hooks.py). Also a NotImplementedError, as jax-triton raises."""

    def __init__(self, message: str, index: int, why: str):
        super().__init__(message)
        self.index, self.why = index, why


@dataclass(frozen=True)
class Param:
    name: str
    index: int
    is_constexpr: bool
    do_not_specialize: bool
    do_not_specialize_on_alignment: bool
    annotation: str  # Triton's normalised annotation ("" if none)
    default: Any = inspect.Parameter.empty


class ReadRecorder(dict):
    """Records which arguments a heuristic reads (ALL: it went through them all)."""

    ALL = "*"

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.read: set[str] = set()

    def keys(self):  # also what {**args} and dict(args) read
        self.read.add(self.ALL)
        return super().keys()

    def __iter__(self):
        self.read.add(self.ALL)
        return super().__iter__()

    def items(self):
        self.read.add(self.ALL)
        return super().items()

    def values(self):
        self.read.add(self.ALL)
        return super().values()

    def __getitem__(self, k):
        self.read.add(k)
        return super().__getitem__(k)

    def get(self, k, default=None):
        self.read.add(k)
        return super().get(k, default)

    def __contains__(self, k):  # `"BLOCK" in args`: the answer depends on what the call passed
        self.read.add(k)
        return super().__contains__(k)


@dataclass
class HeuristicsLayer:
    values: dict[str, Callable[[dict], Any]]
    inside_autotune: bool  # sees the config's meta-parameters


@dataclass
class KernelSpec:
    fn: JITFunction
    params: list[Param]
    configs: list[triton.Config] = field(default_factory=list)  # empty: not autotuned
    tune_keys: list[str] = field(default_factory=list)
    heuristics: list[HeuristicsLayer] = field(default_factory=list)
    reset_to_zero: list[str] = field(default_factory=list)
    restore_value: list[str] = field(default_factory=list)
    early_config_prune: Callable | None = None
    perf_model: Callable | None = None
    top_k: float | int = 1.0

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def arg_names(self) -> list[str]:
        return [p.name for p in self.params]

    @property
    def autotuned(self) -> bool:
        return bool(self.configs)

    @property
    def gluon(self) -> bool:
        return is_gluon(self.fn)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KernelSpecError(f"kernel {self.name}: no parameter named {name!r}")

    def heuristic_names(self) -> set[str]:
        return {k for layer in self.heuristics for k in layer.values}

    def supplied_names(self) -> set[str]:
        """The names a call does not pass: what the autotune configs set (their meta-parameters and
        the launch options of Config.all_kwargs(), which Triton's binder binds to a parameter of that
        name: `num_warps: tl.constexpr`) and what the heuristics set."""
        params = set(self.arg_names)
        return ({k for c in self.configs for k in c.kwargs} | self.heuristic_names()
                | {k for c in self.configs for k in c.all_kwargs() if k in params})

    def heuristics_may_read(self, names: set[str]) -> set[str]:
        """Of `names`, those a heuristic's code might read from its argument dict: whose
        string appears in the code of the heuristic functions or of the functions they
        reach (through their globals and closures); all of them for a heuristic that is
        no Python function. A probe on one call's values (ReadRecorder) misses a read
        in a branch that call did not take; this does not."""
        seen: set[int] = set()
        found: set[str] = set()

        def visit(obj: Any, depth: int) -> bool:  # False: cannot be read
            obj = getattr(obj, "__func__", obj)
            code = getattr(obj, "__code__", None)
            if code is None or id(code) in seen:
                return code is not None
            seen.add(id(code))
            consts = _strings(code)
            found.update(names & consts)
            if depth < 4:
                glob = getattr(obj, "__globals__", {})
                for n in _code_names(code):
                    g = glob.get(n)
                    if callable(g) and not isinstance(g, type):
                        visit(g, depth + 1)
                for cell in getattr(obj, "__closure__", None) or ():
                    try:
                        v = cell.cell_contents
                    except ValueError:
                        continue
                    if callable(v) and not isinstance(v, type):
                        visit(v, depth + 1)
            return True

        for layer in self.heuristics:
            for fn in layer.values.values():
                if not visit(fn, 0):
                    return set(names)
        return found

    def code_size(self) -> int:
        """How much code the kernel applies to what its threads hold, a guess at its compile
        time (compile.schedule.compile_cost): its operations (arithmetic, comparisons, calls,
        subscripts), and at each call of another @jit function that one's, found where
        Triton finds it (the caller's globals and closure cells, modules' attributes). 1 for
        a kernel whose source cannot be read."""
        return max(1, _operations(self.fn, 0, {}))

    def prune(self, configs: list[triton.Config], named_args: dict, kwargs: dict) -> list[triton.Config]:
        """Triton's prune_configs_by semantics: early_config_prune, then perf_model/top_k."""
        pruned = configs
        if self.early_config_prune:
            # Triton passes the call's keyword arguments too (tutorial 06 reads
            # kwargs["N_CTX"]); a call here has no keywords left, so a function
            # taking **kwargs gets every argument by name.
            extra = {k: v for k, v in named_args.items() if k not in kwargs} if _takes_var_kwargs(
                self.early_config_prune) else {}
            pruned = list(self.early_config_prune(configs, named_args, **kwargs, **extra))
            if not pruned:
                raise KernelSpecError(f"kernel {self.name}: early_config_prune returned no configs")
        if self.perf_model:
            top_k = self.top_k
            if isinstance(top_k, float) and top_k <= 1.0:
                top_k = max(1, int(len(configs) * top_k))
            elif not isinstance(top_k, int):
                raise KernelSpecError(f"kernel {self.name}: top_k must be an int or a float <= 1.0")
            if len(pruned) > top_k:
                est = [self.perf_model(**named_args, **kwargs, **c.all_kwargs()) for c in pruned]
                order = sorted(range(len(pruned)), key=lambda i: est[i])
                pruned = [pruned[i] for i in order[:top_k]]
        return pruned


_OPERATIONS = (ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Call, ast.IfExp, ast.AugAssign, ast.Subscript)
# Calls that unroll into a routine per element, not an instruction: how many PTX instructions
# each took per element (sm_90, Triton 3.9); exp, sqrt, rsqrt, floor, divisions took 1-2.
_ROUTINES = {"erf": 34, "log": 39, "log2": 42, "sin": 97, "cos": 97}
_LIBDEVICE = 25  # its functions: tanh 25, exp 16, pow 106


def _routine(fn: Any) -> int:
    module = getattr(fn, "__module__", None) or ""
    if not module.startswith("triton.language"):
        return 0
    return _LIBDEVICE if "libdevice" in module else _ROUTINES.get(getattr(fn, "__name__", ""), 0)


def _operations(fn: Any, depth: int, sizes: dict) -> int:
    """KernelSpec.code_size of one @jit function; `sizes`: those counted already (a helper
    called at many sites, or by many helpers, is read once)."""
    if id(fn) in sizes:
        return sizes[id(fn)]
    sizes[id(fn)] = 0  # a helper that calls itself back adds nothing more
    try:
        tree, py = fn.parse(), fn.fn  # Triton's parse: one thread at a time (compile.compiler.PARSE_LOCK)
        cells, glob = dict(zip(py.__code__.co_freevars, py.__closure__ or ())), py.__globals__
    except (AttributeError, SyntaxError, TypeError, ValueError):
        return 0

    def resolve(node):  # a name, or a module's attribute: what a call calls
        if isinstance(node, ast.Name):
            try:
                return cells[node.id].cell_contents if node.id in cells else glob.get(node.id)
            except ValueError:  # an empty cell
                return None
        base = resolve(node.value) if isinstance(node, ast.Attribute) else None
        return getattr(base, node.attr, None) if inspect.ismodule(base) else None

    n = 0
    for node in ast.walk(tree):
        n += isinstance(node, _OPERATIONS)
        if isinstance(node, ast.Call):
            callee = resolve(node.func)
            if isinstance(callee, JITFunction) and depth < 8:
                n += _operations(callee, depth + 1, sizes)
            else:
                n += max(0, _routine(callee) - 1)
    sizes[id(fn)] = n
    return n


def _strings(code) -> set[str]:
    """The string constants of a code object and of those nested in it."""
    out: set[str] = set()
    for c in code.co_consts:
        if isinstance(c, str):
            out.add(c)
        elif hasattr(c, "co_consts"):
            out |= _strings(c)
    return out


def _code_names(code) -> set[str]:
    out = set(code.co_names) | set(code.co_freevars)
    for c in code.co_consts:
        if hasattr(c, "co_consts"):
            out |= _code_names(c)
    return out


def as_read_now(fn: JITFunction) -> JITFunction:
    """`fn` as Triton's front end reads it now, for a front end that runs later on another
    thread: a copy of the function whose globals are a copy of its module's and whose closure
    cells hold what they hold now, and so for each @jit function it calls, by name or through
    a module (a copy of the module's attributes, but for Triton's own modules). Triton's front
    end iterates a function's globals (CodeGenerator's gscope); run beside the program, the
    live dict changed under it (a global assigned: "dictionary changed size during
    iteration", a candidate lost), and a value changed since the call would compile into the
    binary under the call's key."""
    made: dict[int, Any] = {}  # id(the live object) -> its copy
    copies: set[int] = set()  # id() of every copy: never copied again

    def now(value: Any, names: set[str]) -> Any:
        if id(value) in copies:
            return value
        if isinstance(value, JITFunction):
            return view(value)
        if isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] != "triton":
            if id(value) not in made:
                mod = made[id(value)] = types.ModuleType(value.__name__)
                mod.__dict__.update(value.__dict__)  # one C call: no thread runs during the copy
                copies.add(id(mod))
            mod = made[id(value)]
            for name in names & mod.__dict__.keys():  # what the code reads of it
                mod.__dict__[name] = now(mod.__dict__[name], names)
            return mod
        return value

    def view(f: JITFunction) -> JITFunction:
        if id(f) not in made:
            v = made[id(f)] = copy.copy(f)
            copies.add(id(v))
            live = f.__globals__
            if id(live) not in made:  # one copy per module: its functions see one another's views
                made[id(live)] = dict(live)
            v.__globals__ = scope = made[id(live)]
            names = _code_names(f.fn.__code__)
            for name in names & scope.keys():
                scope[name] = now(scope[name], names)
            if f.fn.__closure__:
                v.fn = _with_cells(f.fn, tuple(_cell_now(c, lambda x: now(x, names)) for c in f.fn.__closure__))
        return made[id(f)]

    return view(fn)


def _cell_now(cell: types.CellType, now: Callable[[Any], Any]) -> types.CellType:
    try:
        return types.CellType(now(cell.cell_contents))
    except ValueError:  # a cell not assigned yet
        return types.CellType()


def _with_cells(py: types.FunctionType, cells: tuple) -> types.FunctionType:
    """`py` with other closure cells: what Triton reads of a @jit function's Python function."""
    out = types.FunctionType(py.__code__, py.__globals__, py.__name__, py.__defaults__, cells)
    out.__kwdefaults__, out.__qualname__, out.__module__ = py.__kwdefaults__, py.__qualname__, py.__module__
    out.__doc__, out.__annotations__ = py.__doc__, dict(py.__annotations__)
    out.__dict__.update(py.__dict__)
    return out


def is_gluon(fn: Any) -> bool:
    """Whether `fn` is a Gluon kernel (@triton.experimental.gluon.jit): the same
    binder as @triton.jit, but its own ASTSource (IR starts at TTGIR)."""
    check = getattr(fn, "is_gluon", None)  # JITFunction.is_gluon(), Triton 3.5+
    return bool(check()) if callable(check) else False


def _takes_var_kwargs(fn: Callable) -> bool:
    try:
        return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False


def _params_of(fn: JITFunction) -> list[Param]:
    out = []
    for i, kp in enumerate(fn.params):
        out.append(Param(
            name=kp.name, index=i, is_constexpr=kp.is_constexpr,
            do_not_specialize=kp.do_not_specialize,
            do_not_specialize_on_alignment=getattr(kp, "do_not_specialize_on_alignment", False),
            annotation=kp.annotation or "", default=kp.default))
    return out


def kernel_spec(kernel: Any) -> KernelSpec:
    """Unwraps triton.autotune / triton.heuristics (either order) down to the jit function."""
    if isinstance(kernel, KernelSpec):
        return kernel
    layers = []
    obj = kernel
    while not isinstance(obj, JITFunction):
        if isinstance(obj, (Autotuner, Heuristics)):
            layers.append(obj)
            obj = obj.fn
        else:
            raise KernelSpecError(f"{kernel!r} is not a @triton.jit function (or a Gluon @gluon.jit one, or an "
                                  "autotune/heuristics wrapper of one)")
    fn = obj
    spec = KernelSpec(fn=fn, params=_params_of(fn))
    seen_autotune = False
    for layer in layers:  # outermost first
        if isinstance(layer, Autotuner):
            if seen_autotune:
                raise KernelSpecError(f"kernel {fn.__name__}: nested triton.autotune wrappers are not supported")
            seen_autotune = True
            _read_autotuner(spec, layer)
        else:
            spec.heuristics.append(HeuristicsLayer(dict(layer.values), inside_autotune=seen_autotune))
    _validate(spec)
    return spec


def _read_autotuner(spec: KernelSpec, at: Autotuner) -> None:
    if getattr(at, "user_defined_pre_hook", False) or getattr(at, "user_defined_post_hook", False):
        raise KernelSpecError(
            f"kernel {spec.name}: triton.autotune(pre_hook=/post_hook=) runs arbitrary Python around every launch, "
            "which lazytriton's C++ launch path cannot do; use reset_to_zero=/restore_value= instead")
    spec.configs = list(at.configs)
    spec.tune_keys = list(at.keys or [])
    spec.reset_to_zero = list(at.reset_to_zero or [])
    spec.restore_value = list(at.restore_value or [])
    spec.early_config_prune = at.early_config_prune
    spec.perf_model = at.perf_model
    spec.top_k = at.configs_top_k


@functools.lru_cache(maxsize=None)
def backend_option_names() -> frozenset:
    """The compile options of Triton's NVIDIA and AMD backends (their options' fields)."""
    names: set = set()
    for module, cls in (("triton.backends.nvidia.compiler", "CUDAOptions"), ("triton.backends.amd.compiler", "HIPOptions")):
        try:
            names |= {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
        except (ImportError, AttributeError, TypeError):  # a Triton without that backend
            pass
    return frozenset(names)


def _validate(spec: KernelSpec) -> None:
    names = set(spec.arg_names)
    for what, lst in (("key", spec.tune_keys), ("reset_to_zero", spec.reset_to_zero),
                      ("restore_value", spec.restore_value)):
        for n in lst:
            if n not in names:
                raise KernelSpecError(f"kernel {spec.name}: {what} names {n!r}, which is not a parameter "
                                      f"(parameters: {', '.join(spec.arg_names)})")
    for i, cfg in enumerate(spec.configs):
        for k in cfg.kwargs:
            # A backend option in a config's kwargs is Triton's idiom for AMD's (waves_per_eu,
            # matrix_instr_nonkdim, kpack): Triton's binder takes it as an option, so does lazytriton's.
            if k not in names and k not in backend_option_names():
                raise KernelSpecError(f"kernel {spec.name}: config {i} sets {k!r}, which is not a parameter")
        options = {k: getattr(cfg, k, None) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")}
        options.update((k, v) for k, v in cfg.kwargs.items() if k in OPTION_NAMES)
        for k, v in options.items():
            try:
                check_option(k, v, f"kernel {spec.name}: config {i}")
            except (TypeError, ValueError) as exc:
                raise KernelSpecError(str(exc)) from None
    try:
        pre_hooks.check(spec)
    except pre_hooks.HookRefused as exc:
        raise pre_hook_refusal(spec.name, spec.configs, *exc.args) from None


def pre_hook_refusal(name: str, configs: list, index: int, why: str) -> PreHookRefused:
    """The error for a config pre_hook lazytriton cannot run (pre_hooks.py)."""
    return PreHookRefused(
        f"kernel {name}: config {index} ({configs[index]}) has a pre_hook; lazytriton launches from C++ without "
        "Python and cannot run it. Use reset_to_zero=/restore_value= on triton.autotune instead (a pre_hook that "
        f"only sets tensor descriptors' block_shape from the config's meta-parameters is supported; this one {why})",
        index, why)
