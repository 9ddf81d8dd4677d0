"""A kernel's portable recipe: Triton's front end in a compile server's worker,
without importing the kernel's module there.

A kernel that lives in a big package cannot be compiled by name in another
process without importing that package (seconds per process). Its front end
(Python AST -> TTIR) needs far less: the source of the @jit function and of
every @jit function it calls, and the values of the names those read. As
Inductor ships self-contained kernel source to its compile workers, the caller
makes a picklable recipe of those (`capture`), once per kernel, and the worker
rebuilds the functions from it (`rebuild`) and compiles the candidate's
ASTSource from the first stage on (`compile_portable`).

What a recipe holds, per function: its source lines, file name and first line
as ``inspect.getsourcelines`` gave them to Triton (so source locations in the
IR, line info in the cubin and Triton's error messages are the same), its
Triton class and jit options, and the names its source reads: other @jit
functions (by index), plain data (numbers, strings, None, tuples of those,
``tl.dtype``; ``tl.constexpr`` of those), modules cheap to import by name
(`ALLOWED_MODULES`), objects such a module defines (``tl.float16``,
``libdevice.exp``), and other modules rebuilt as namespaces holding only the
attributes the source reads. Closures keep their cells.

Exactness: the worker computes Triton's own hash of the rebuilt ASTSource (its
cache key: the sources of the kernel and every callee, their first lines, the
constexpr globals, the specialization) and compiles only when it equals the
caller's hash of the original; else it refuses (`RecipeRefused`) and the
caller compiles that kernel the other way (front end here, TTIR text to the
workers: compile.ir_text), as it does for anything a recipe cannot hold (a
Python function or a class the source reads, a constexpr holding a function,
a repr hook, ...): decided once per kernel, said once at debug level.
"""
from __future__ import annotations

import __future__
import ast
import importlib
import inspect
import linecache
import logging
import pickle
import sys
import threading
import types
from typing import Any

log = logging.getLogger("lazytriton.compile.recipe")

__all__ = ["ALLOWED_MODULES", "RecipeRefused", "Uncapturable", "capture", "compile_portable", "job_source",
           "rebuild"]

# Modules a worker may import by name: Triton's (already imported there) and the standard library's
# cheapest. Any other module a kernel reads is rebuilt as a namespace, never imported.
ALLOWED_MODULES = ("triton", "math", "builtins", "copy", "operator", "functools", "itertools", "typing")

_FUTURE_FLAGS = 0
for _name in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _name).compiler_flag


class Uncapturable(Exception):
    """Something a kernel's front end reads that a recipe cannot carry."""


class RecipeRefused(Exception):
    """The worker could not rebuild the kernel exactly (its Triton hash differs,
    or its sources did not rebuild): the caller runs the front end itself."""


def _allowed(module: str) -> bool:
    return module in ALLOWED_MODULES or module.startswith("triton.")


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _by_reference(v: Any) -> tuple | None:
    """("ref", module, qualname) for an object an allowed module defines, else None."""
    module, qualname = getattr(v, "__module__", None), getattr(v, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not _allowed(module) or "<" in qualname:
        return None
    try:
        return ("ref", module, qualname) if _resolve(module, qualname) is v else None
    except Exception:
        return None


def _is_data(v: Any) -> bool:
    import triton.language as tl

    if v is None or type(v) in (int, float, bool, str, bytes, complex):
        return True
    if type(v) in (tuple, list):
        return all(_is_data(x) for x in v)
    return isinstance(v, tl.dtype) and _allowed(type(v).__module__)


# -- the caller's side: capturing ----------------------------------------------------------------------

def _reads(fn_node: ast.FunctionDef) -> tuple[dict[str, set[tuple]], set[str]]:
    """{name: the attribute chains read from it} for every name the function
    reads, and the names it binds itself (parameters, assignments)."""
    reads: dict[str, set[tuple]] = {}
    local = {a.arg for a in fn_node.args.posonlyargs + fn_node.args.args + fn_node.args.kwonlyargs}
    local |= {a.arg for a in (fn_node.args.vararg, fn_node.args.kwarg) if a is not None}
    for node in ast.walk(fn_node):
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                reads.setdefault(node.id, set()).add(())
            else:
                local.add(node.id)
        elif isinstance(node, ast.Attribute):
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name):
                reads.setdefault(base.id, set()).add(tuple(reversed(chain)))
    return reads, local


class _Capture:
    """One kernel's recipe under construction: its functions (the kernel
    first) and their global scopes, one per globals dict as in the caller."""

    def __init__(self) -> None:
        self.fns: list[dict | None] = []
        self.scopes: list[dict] = []
        self._fn_index: dict[int, int] = {}
        self._scope_index: dict[int, int] = {}
        self._keep: list = []  # what the indexes' ids belong to, alive while the recipe is

    def snapshot(self) -> dict:
        return {"fns": list(self.fns), "scopes": [dict(s, names=dict(s["names"])) for s in self.scopes]}

    def function(self, jf) -> int:
        i = self._fn_index.get(id(jf))
        if i is not None:
            return i
        i = len(self.fns)
        self._fn_index[id(jf)] = i
        self._keep.append(jf)
        self.fns.append(None)  # a function that calls itself finds its index
        self.fns[i] = self._function(jf)
        return i

    def _function(self, jf) -> dict:
        from triton.runtime.jit import JITFunction

        cls = type(jf)
        ref = _by_reference(cls)
        name = getattr(jf, "__qualname__", repr(jf))
        if ref is None:
            raise Uncapturable(f"{name} is a {cls.__module__}.{cls.__qualname__}")
        if getattr(jf, "_repr", None) is not None:
            raise Uncapturable(f"{name} has a repr hook")
        py = getattr(jf, "fn", None)
        if not isinstance(py, types.FunctionType):
            raise Uncapturable(f"{name} wraps a {type(py).__name__}")
        raw_src, start = getattr(jf, "raw_src", None), getattr(jf, "starting_line_number", None)
        if raw_src is None or start is None:
            raise Uncapturable("this Triton keeps no raw source")
        if py.__code__.co_freevars and start < 2:  # no line above it for the factory that binds its cells
            raise Uncapturable(f"{name} is a closure on line {start}")
        tree = jf.parse()
        fn_node = tree.body[0]
        g = py.__globals__
        try:
            nonlocal_values = {n: c.cell_contents for n, c in zip(py.__code__.co_freevars, py.__closure__ or ())}
        except ValueError:
            raise Uncapturable(f"{name} has an empty closure cell") from None
        if id(g) not in self._scope_index:
            self._scope_index[id(g)] = len(self.scopes)
            self._keep.append(g)
            self.scopes.append({"module": py.__module__, "names": {}})
        scope = self.scopes[self._scope_index[id(g)]]["names"]
        reads, local = _reads(fn_node)
        nonlocals = {}
        for var, chains in sorted(reads.items()):
            if var in nonlocal_values:
                where, table, value = "closure variable", nonlocals, nonlocal_values[var]
            elif var in g:
                where, table, value = "global", scope, g[var]
            else:  # a builtin, or a name Triton will refuse alike on both sides
                continue
            try:
                desc = self.value(value, chains)
            except Uncapturable as exc:
                if var in local:  # a local of the same name hides it
                    continue
                raise Uncapturable(f"{name}: {where} {var!r}: {exc}") from None
            table[var] = _merge(table.get(var), desc)
        opts = {}
        if isinstance(jf, JITFunction):
            for k in ("version", "do_not_specialize", "do_not_specialize_on_alignment", "debug", "noinline"):
                if hasattr(jf, k):
                    opts[k] = getattr(jf, k)
        return {"cls": ref[1:], "opts": opts, "module": py.__module__, "qualname": py.__qualname__,
                "name": py.__name__, "file": py.__code__.co_filename, "start": start, "raw_src": list(raw_src),
                "src": jf.src, "flags": py.__code__.co_flags & _FUTURE_FLAGS, "freevars": list(py.__code__.co_freevars),
                "nonlocals": nonlocals, "scope": self._scope_index[id(g)]}

    def value(self, v: Any, chains=frozenset({()})) -> tuple:
        """The portable description of value `v`, read through `chains`
        (attribute paths, () for the value itself)."""
        import triton.language as tl
        from triton.runtime.jit import JITCallable

        if isinstance(v, JITCallable):
            ref = _by_reference(v)  # one of Triton's own (triton.language.standard's): the worker has it
            if ref is not None:
                return ref
            if not hasattr(v, "fn"):  # a bound constexpr function
                raise Uncapturable(f"a {type(v).__name__}")
            return ("fn", self.function(v))
        if isinstance(v, types.ModuleType):
            if _allowed(v.__name__) and sys.modules.get(v.__name__) is v:
                return ("module", v.__name__)
            attrs: dict[str, set] = {}
            for chain in chains:
                if chain:
                    attrs.setdefault(chain[0], set()).add(chain[1:] or ())
            out = {}
            for attr, sub in sorted(attrs.items()):
                if hasattr(v, attr):
                    try:
                        out[attr] = self.value(getattr(v, attr), sub)
                    except Uncapturable as exc:
                        raise Uncapturable(f"{v.__name__}.{attr}: {exc}") from None
            return ("namespace", v.__name__, out)
        if isinstance(v, tl.constexpr):
            if not _is_data(v.value):
                raise Uncapturable(f"a constexpr holding a {type(v.value).__name__}")
            return ("constexpr", v.value)
        ref = _by_reference(v)
        if ref is not None:
            return ref
        if _is_data(v):
            return ("data", v)
        raise Uncapturable(f"a {type(v).__module__}.{type(v).__qualname__}")


def _merge(old: tuple | None, new: tuple) -> tuple:
    """Two functions of one module read different attributes of one namespace."""
    if old is None or old[0] != "namespace" or new[0] != "namespace":
        return new
    attrs = dict(old[2])
    for k, v in new[2].items():
        attrs[k] = _merge(attrs.get(k), v)
    return ("namespace", new[1], attrs)


class _Kernel:
    """A kernel's recipe, or why it has none."""

    def __init__(self, fn) -> None:
        self.fn = fn  # keeps id(fn) the key of this entry
        self.lock = threading.Lock()
        self.capture: _Capture | None = None
        self.why_not: str | None = None
        self.candidates_said = False
        self._snapshot: tuple[int, dict] | None = None
        try:
            cap = _Capture()
            cap.function(fn)
            pickle.dumps(cap.snapshot(), protocol=pickle.HIGHEST_PROTOCOL)
            self.capture = cap
        except Uncapturable as exc:
            self.refuse(str(exc))
        except Exception as exc:  # anything unforeseen: the front end stays here
            self.refuse(f"{type(exc).__name__}: {exc}")

    def refuse(self, why: str) -> None:
        with self.lock:
            if self.why_not is not None:
                return
            self.capture, self.why_not = None, why
        log.debug("kernel %s: Triton's front end runs in this process (no portable recipe: %s)",
                  getattr(self.fn, "__name__", self.fn), why)

    def snapshot(self) -> dict | None:
        with self.lock:
            cap = self.capture
            if cap is None:
                return None
            if self._snapshot is None or self._snapshot[0] != len(cap.fns):
                self._snapshot = (len(cap.fns), cap.snapshot())
            return self._snapshot[1]


_kernels: dict[int, _Kernel] = {}
_kernels_lock = threading.Lock()


def capture(fn) -> _Kernel:
    """The recipe of kernel `fn` (a JITFunction), made on first use."""
    with _kernels_lock:  # held while a recipe is made (milliseconds): each kernel's is made and said once
        k = _kernels.get(id(fn))
        if k is None or k.fn is not fn:
            k = _kernels[id(fn)] = _Kernel(fn)
        return k


def refuse(fn, why: str) -> None:
    """A worker refused the kernel's recipe: its candidates' front ends run here from now on."""
    capture(fn).refuse(why)


def job_source(fn, signature: dict, constexprs: dict, attrs: dict, options: dict) -> dict | None:
    """What a worker needs to run one candidate's front end and back end
    (picklable, no user objects), or None: its front end must run here."""
    from .targets import ast_source

    k = capture(fn)
    recipe = k.snapshot()
    if recipe is None:
        return None
    try:
        digest = ast_source(fn, signature, constexprs, attrs).hash()
    except Exception:  # Triton's own error: the front end here reports it
        return None
    portable = {}
    try:
        with k.lock:
            for key, v in constexprs.items():
                portable[key] = k.capture.value(v) if k.capture is not None else None
        recipe = k.snapshot()  # a constexpr argument that is a @jit function adds it
    except Uncapturable as exc:
        if not k.candidates_said:
            k.candidates_said = True
            log.debug("kernel %s: a candidate's front end runs in this process (constexpr argument: %s)",
                      fn.__name__, exc)
        return None
    if recipe is None:
        return None
    return {"recipe": recipe, "signature": signature, "constexprs": portable, "attrs": attrs, "options": options,
            "hash": digest, "name": fn.__name__}


# -- the worker's side: rebuilding ---------------------------------------------------------------------

def _value(desc: tuple, objs: list | None) -> Any:
    import triton.language as tl

    kind = desc[0]
    if kind == "fn":
        return objs[desc[1]] if objs is not None else None
    if kind == "module":
        return importlib.import_module(desc[1])
    if kind == "namespace":
        ns = types.ModuleType(desc[1])
        for k, d in desc[2].items():
            setattr(ns, k, _value(d, objs))
        return ns
    if kind == "constexpr":
        return tl.constexpr(desc[1])
    if kind == "ref":
        return _resolve(desc[1], desc[2])
    return desc[1]


def _python_function(f: dict, scope: dict) -> types.FunctionType:
    """The Python function behind one @jit function: its source compiled under
    its file name, its first line at its first line (where inspect, and so
    Triton, looks for it), its closure cells empty until filled."""
    start, name, freevars = f["start"], f["name"], f["freevars"]
    def_line = start + next((i for i, ln in enumerate(f["raw_src"]) if ln.strip().startswith("def ")), 0)
    lines = f["src"].splitlines(keepends=True)
    if freevars:  # a factory one line above binds the closure's names
        if start < 2:
            raise RecipeRefused(f"{name}: a closure on line {start}")
        text = "\n" * (start - 2) + f"def _lt_factory(_lt_keep, {', '.join(freevars)}):\n"
        indent = " "
    else:
        text, indent = "\n" * (start - 1), ""
    if def_line > start:  # the decorators' first line is the function's first line
        text += indent + "@_lt_keep\n" + "\n" * (def_line - start - 1)
    text += "".join(indent + ln if ln.strip() else ln for ln in lines)
    if freevars:
        text += f"\n return {name}\n"
    code = compile(text, f["file"], "exec", flags=f["flags"], dont_inherit=True)
    keep = lambda fn: fn  # noqa: E731
    local: dict = {"_lt_keep": keep}
    exec(code, scope, local)
    py = local["_lt_factory"](keep, *[None] * len(freevars)) if freevars else local[name]
    py.__qualname__, py.__module__ = f["qualname"], f["module"]
    if py.__code__.co_firstlineno != start:
        raise RecipeRefused(f"{name}: first line {py.__code__.co_firstlineno}, not {start}")
    return py


def rebuild(recipe: dict) -> list:
    """The recipe's Triton functions (the kernel first), rebuilt in this process
    (a forked worker: it changes linecache). Raises RecipeRefused."""
    try:
        return _rebuild(recipe)
    except RecipeRefused:
        raise
    except Exception as exc:  # whatever went wrong, the caller's front end will do
        raise RecipeRefused(f"rebuilding: {type(exc).__name__}: {exc}") from None


def _rebuild(recipe: dict) -> list:
    fns = recipe["fns"]
    files: dict[str, list[str]] = {}
    for f in fns:  # the sources where inspect.getsourcelines finds them
        lines = files.setdefault(f["file"], [])
        end = f["start"] - 1 + len(f["raw_src"])
        lines.extend(["\n"] * (end - len(lines)))
        lines[f["start"] - 1:end] = f["raw_src"]
    for path, lines in files.items():
        linecache.cache[path] = (sum(map(len, lines)), None, lines, path)  # mtime None: never checked on disk
    scopes = [{"__name__": s["module"]} for s in recipe["scopes"]]
    for scope, s in zip(scopes, recipe["scopes"]):  # what defaults and annotations read, at definition
        scope.update({k: _value(d, None) for k, d in s["names"].items() if d[0] != "fn"})
    pys = [_python_function(f, scopes[f["scope"]]) for f in fns]
    objs = []
    for f, py in zip(fns, pys):
        cls = _resolve(*f["cls"])
        accepted = inspect.signature(cls.__init__).parameters
        objs.append(cls(py, **{k: v for k, v in f["opts"].items() if k in accepted}))
    for scope, s in zip(scopes, recipe["scopes"]):
        scope.update({k: _value(d, objs) for k, d in s["names"].items()})
    for f, py in zip(fns, pys):
        cells = dict(zip(py.__code__.co_freevars, py.__closure__ or ()))
        for k, d in f["nonlocals"].items():
            cells[k].cell_contents = _value(d, objs)
    for f, obj in zip(fns, objs):
        if obj.src != f["src"] or obj.starting_line_number != f["start"] or list(obj.raw_src) != f["raw_src"]:
            raise RecipeRefused(f"{f['qualname']}: its source did not rebuild as it was")
    return objs


def compile_portable(source: dict, target):
    """A worker's compile of `job_source`'s output: the kernel rebuilt, its
    ASTSource checked against the caller's hash, then triton.compile from the
    first stage. Raises RecipeRefused (anything that goes wrong before
    triton.compile), or what Triton raises."""
    import triton

    from ..cache import CompiledBinary
    from .targets import ast_source

    objs = rebuild(source["recipe"])
    try:
        constexprs = {k: _value(d, objs) for k, d in source["constexprs"].items()}
        src = ast_source(objs[0], source["signature"], constexprs, source["attrs"])
        digest = src.hash()
    except Exception as exc:
        raise RecipeRefused(f"Triton's hash of the rebuilt kernel: {type(exc).__name__}: {exc}") from None
    if digest != source["hash"]:
        raise RecipeRefused(f"the rebuilt kernel's Triton hash {digest[:12]} is not the caller's {source['hash'][:12]}")
    return CompiledBinary.from_triton(triton.compile(src, target=target, options=source["options"]))
