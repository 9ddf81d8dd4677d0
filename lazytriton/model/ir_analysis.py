"""Infer which pointer arguments a Triton kernel may write, from its TTIR text.

Autotuning on the caller's real buffers means every buffer a trial may write
has to be snapshotted and restored around it.  Restoring read-only inputs is
wasted work, so :func:`written_pointer_args` reads ``compiled.asm["ttir"]`` and
reports the kernel parameters whose memory may be written.

The analysis is deliberately conservative.  Each written pointer operand is
traced back through pointer-forwarding ops (``tt.addptr`` base, ``tt.splat``,
``arith.select``, ``scf.for`` iter_args, ...) to function arguments; when any
link of a chain is not understood, or the text is not understood at all, the
answer is ``None`` ("assume every pointer argument is written").  It is a
line/token-based reading of MLIR's pretty form, not a full parser.

Keep this module free of package imports: it is pure text analysis, and the
CPU-only tests load it without the compiled C++ core.
"""

from __future__ import annotations

import re

__all__ = ["written_pointer_args"]

# --------------------------------------------------------------------------
# Op tables
# --------------------------------------------------------------------------

# Ops that write through their first SSA operand (a pointer, tensor of
# pointers, block pointer or tensor descriptor).
_WRITE_OPS = frozenset({
    "tt.store", "tt.atomic_rmw", "tt.atomic_cas",
    "tt.descriptor_store", "tt.descriptor_scatter", "tt.descriptor_reduce",
})
# Experimental ops that write to memory named by their first operand
# (``experimental_descriptor_store``, ``experimental_tensormap_create``, ...).
_EXPERIMENTAL_WRITE = re.compile(r"^tt\.experimental_\w*(store|scatter|reduce|atomic|create)")

# Ops whose result is the same memory as some of their operands: result ->
# operand positions to follow.  Other operands are offsets/shapes/conditions.
_FOLLOW_OPS = {
    "tt.addptr": (0,), "tt.splat": (0,), "tt.broadcast": (0,),
    "tt.expand_dims": (0,), "tt.reshape": (0,), "tt.trans": (0,),
    "tt.make_tensor_ptr": (0,), "tt.advance": (0,),
    "tt.make_tensor_descriptor": (0,), "tt.reinterpret_tensor_descriptor": (0,),
    "ttng.reinterpret_tensor_descriptor": (0,),
    "tt.bitcast": (0,), "tt.ptr_to_int": (0,),
    "arith.select": (1, 2),  # operand 0 is the condition
    "tt.join": (0, 1), "tt.cat": (0, 1), "tt.split": (0,), "tt.gather": (0,),
    "tt.unsplat": (0,), "ttg.convert_layout": (0,),
}

# Ops known not to write memory.  Anything not listed here (and not a write,
# follow or call op) that touches a pointer is treated as a possible writer.
_SAFE_OPS = frozenset({
    "module", "builtin.module", "tt.func", "tt.return",
    "tt.load", "tt.descriptor_load", "tt.descriptor_gather",
    "tt.experimental_descriptor_load", "tt.experimental_descriptor_gather",
    "tt.experimental_tensormap_fenceproxy_acquire",
    "tt.dot", "tt.dot_scaled", "tt.reduce", "tt.reduce.return", "tt.scan",
    "tt.scan.return", "tt.map_elementwise", "tt.map_elementwise.return",
    "tt.make_range", "tt.get_program_id", "tt.get_num_programs",
    "tt.print", "tt.assert", "tt.fp_to_fp", "tt.precise_sqrt",
    "tt.precise_divf", "tt.mulhiui", "tt.clampf", "tt.histogram",
    "tt.int_to_ptr", "gpu.barrier", "llvm.intr.assume",
})
_SAFE_PREFIXES = ("arith.", "math.", "scf.", "cf.", "ub.")

_TERMINATORS = frozenset({"scf.yield", "scf.condition"})
_POINTERISH = re.compile(r"ptr|tensordesc")

# --------------------------------------------------------------------------
# Lexing helpers
# --------------------------------------------------------------------------

_ID = r"%[\w$.\-]+"
_USE_RE = re.compile(_ID + r"(?:#\d+)?")
_STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"')
_LOC_RE = re.compile(r"(?<![\w%$.#])loc\(")
_RESULTS_RE = re.compile(r"^\s*(" + _ID + r"(?::\d+)?(?:\s*,\s*" + _ID + r"(?::\d+)?)*)\s*=(?!=)\s*")
_NAME_RE = re.compile(r'(?:""|([A-Za-z_][\w$]*(?:\.[\w$]+)*))(?=[\s(<{]|$)')
_RAW_NAME_RE = re.compile(r'^\s*(?:' + _ID + r'(?::\d+)?(?:\s*,\s*' + _ID + r'(?::\d+)?)*\s*=\s*)?"([^"]*)"')
_BINDING_RE = re.compile(r"(" + _ID + r")\s*=\s*(" + _ID + r"(?:#\d+)?)")
_LABEL_RE = re.compile(r"^\s*\^([\w$.\-]+)\s*(?:\((.*)\))?\s*:\s*$")
_ARGDEF_RE = re.compile(r"(" + _ID + r")\s*:")
_BRANCH_RE = re.compile(r"\^([\w$.\-]+)(?:\s*\(([^()]*)\))?")


class _Unsupported(Exception):
    """Text we do not understand: the caller must assume the worst."""


def _strip_locs(text: str) -> str:
    """Remove ``loc(...)`` trailers (balanced parens; strings already blanked)."""
    while True:
        m = _LOC_RE.search(text)
        if not m:
            return text
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if depth:
            raise _Unsupported("unbalanced loc(")
        text = text[:m.start()] + text[i:]


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside (), <>, [], {} (``->`` is not a bracket)."""
    text = text.replace("->", "\x00")
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[{":
            depth += 1
        elif ch in ")>]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.replace("\x00", "->").strip() for p in parts]


def _brace_delta(text: str) -> int:
    """Net '{' count of a line; a '}' closing nothing on this line is an error."""
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise _Unsupported("stray }")
    return depth


# --------------------------------------------------------------------------
# IR model
# --------------------------------------------------------------------------

class _Scope:
    def __init__(self, parent: "_Scope | None"):
        self.parent, self.names = parent, {}

    def define(self, name: str, uid: int) -> None:
        if name in self.names:  # MLIR names are unique in a scope: we misparsed
            raise _Unsupported("duplicate SSA name " + name)
        self.names[name] = uid

    def lookup(self, name: str) -> int | None:
        scope = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.parent
        return None


class _Block:
    def __init__(self, label: str | None):
        self.label, self.args, self.ops = label, [], []


class _Region:
    def __init__(self, op: "_Op", parent_scope: _Scope):
        self.op, self.scope, self.blocks = op, _Scope(parent_scope), [_Block(None)]


class _Op:
    def __init__(self, name: str, text: str, scope: _Scope, region: "_Region | None"):
        self.name, self.text, self.scope, self.parent = name, text, scope, region
        self.results: list[int] = []
        self.uses: list[str] = []                       # operand names, in order
        self.bindings: list[tuple[str, str]] = []       # header '%def = %init'
        self.regions: list[_Region] = []

    def operand(self, i: int) -> int | None:
        return self.scope.lookup(self.uses[i]) if i < len(self.uses) else None


class _Module:
    """SSA values are integers; ``srcs[v]`` lists values ``v`` may alias."""

    def __init__(self):
        self.ops: list[_Op] = []
        self.srcs: list[list[int]] = []
        self.funcs: list[tuple[_Op, list[tuple[str, str]]]] = []
        self.roots: dict[int, str | None] = {}  # arg value -> param (None: callee arg)

    def new_value(self, scope: _Scope, name: str) -> int:
        self.srcs.append([])
        scope.define(name, len(self.srcs) - 1)
        return len(self.srcs) - 1


# --------------------------------------------------------------------------
# Parsing
# --------------------------------------------------------------------------

def _clean(raw: str) -> str:
    return _strip_locs(_STRING_RE.sub('""', raw)).rstrip()


def _parse(ttir: str) -> _Module:
    mod = _Module()
    top = _Scope(None)
    stack: list[_Region] = []          # open regions, innermost last
    in_resource = False
    for raw in ttir.splitlines():
        s = raw.strip()
        if in_resource:                # '{-# dialect_resources ... #-}' blob
            in_resource = "#-}" not in s
            continue
        if s.startswith("{-#"):
            in_resource = "#-}" not in s
            continue
        if not s or s.startswith("#") or s.startswith("//"):
            continue
        line = _clean(raw)
        if not line.strip():
            continue
        _parse_line(mod, raw, line, stack, top)
    if stack:
        raise _Unsupported("unclosed region")
    return mod


def _parse_line(mod, raw, line, stack, top) -> None:
    body = line.lstrip()
    closed = None
    while body[:1] in ("}", ")") and (closed is not None or body[0] == "}"):
        if body[0] == "}":             # closes the innermost region
            if not stack:
                raise _Unsupported("unbalanced }")
            closed = stack.pop().op
        body = body[1:].lstrip()
    if closed is not None:             # '} else {', '} do {', '}) : (...) -> ...'
        if _USE_RE.search(body) or _brace_delta(body) > 1:
            raise _Unsupported("unexpected text after }: " + body)
        if _brace_delta(body) == 1:
            _open_region(mod, closed, stack, top)
        return
    label = _LABEL_RE.match(body)
    if label:
        _add_block(mod, label, stack)
        return
    _parse_op(mod, raw, body, stack, top)


def _add_block(mod, m, stack) -> None:
    if not stack:
        raise _Unsupported("block label outside a region")
    region = stack[-1]
    block = region.blocks[-1]
    if block.ops or block.label is not None or block.args:
        block = _Block(m.group(1))
        region.blocks.append(block)
    block.label = m.group(1)
    for name in _ARGDEF_RE.findall(m.group(2) or ""):
        block.args.append(mod.new_value(region.scope, name))


def _parse_op(mod, raw, body, stack, top) -> None:
    scope = stack[-1].scope if stack else top
    res = _RESULTS_RE.match(body)
    rest = body[res.end():] if res else body
    m = _NAME_RE.match(rest)
    if not m:
        raise _Unsupported("not an op: " + body)
    name = m.group(1)
    if name is None:                   # generic form: "dialect.op"(...)
        q = _RAW_NAME_RE.match(raw)
        if not q:
            raise _Unsupported("unreadable generic op")
        name = q.group(1)
    if "." not in name and name != "module":
        raise _Unsupported("unknown statement " + name)
    op = _Op(name, rest[m.end():], scope, stack[-1] if stack else None)
    if stack:
        stack[-1].blocks[-1].ops.append(op)
    mod.ops.append(op)
    if res:
        _define_results(mod, op, res.group(1))
    _read_operands(op)
    opens = _brace_delta(op.text)
    if opens > 1 or (op.bindings and opens != 1):
        raise _Unsupported("unexpected region syntax: " + body)
    if name == "tt.func":
        mod.funcs.append((op, _func_args(op.text)))
    if opens:
        _open_region(mod, op, stack, top)


def _define_results(mod, op, text) -> None:
    for item in _split_top(text):
        base, _, count = item.partition(":")
        base = base.strip()
        n = int(count) if count else 1
        if n == 1:
            uid = mod.new_value(op.scope, base)
            if count:
                op.scope.define(base + "#0", uid)
            op.results.append(uid)
        else:
            for i in range(n):
                op.results.append(mod.new_value(op.scope, f"{base}#{i}"))


def _read_operands(op) -> None:
    """Collect SSA uses; '%a = %b' pairs in a region header define block args."""
    if op.name == "tt.func":           # header names are definitions, not uses
        return
    text = op.text
    op.bindings = _BINDING_RE.findall(text)
    text = _BINDING_RE.sub(lambda b: " " + b.group(2), text) if op.bindings else text
    op.uses = _USE_RE.findall(text)


def _open_region(mod, op, stack, top) -> None:
    parent = stack[-1].scope if stack else top
    region = _Region(op, parent)
    op.regions.append(region)
    stack.append(region)
    if op.name == "tt.func":
        for name, _ in mod.funcs[-1][1]:
            region.blocks[0].args.append(mod.new_value(region.scope, name))
    elif len(op.regions) == 1:
        for name, _ in op.bindings:
            region.blocks[0].args.append(mod.new_value(region.scope, name))


def _func_args(text: str) -> list[tuple[str, str]]:
    """``(%x: !tt.ptr<f32> {attrs}, ...)`` -> [(name, type)]."""
    m = re.search(r"@[\w$.\-]+\s*\(", text)
    if not m:
        raise _Unsupported("bad tt.func header")
    depth, i = 1, m.end()
    while i < len(text) and depth:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        i += 1
    inner = text[m.end():i - 1]
    args = []
    for piece in _split_top(inner) if inner.strip() else []:
        a = re.match(r"(" + _ID + r")\s*:\s*(.*)$", piece)
        if not a:
            raise _Unsupported("bad tt.func argument " + piece)
        args.append((a.group(1), re.sub(r"\{.*\}", "", a.group(2)).strip()))
    return args


# --------------------------------------------------------------------------
# Data flow
# --------------------------------------------------------------------------

def _link(mod: _Module) -> None:
    """Fill ``srcs``: which values each value may alias."""
    for op in mod.ops:
        follow = _FOLLOW_OPS.get(op.name)
        if follow:
            srcs = [op.operand(i) for i in follow]
            if None not in srcs:
                for r in op.results:
                    mod.srcs[r].extend(srcs)
        elif op.name == "scf.for":
            _link_for(mod, op)
        elif op.name == "scf.while":
            _link_while(mod, op)
        elif op.name in ("scf.if", "scf.index_switch", "scf.execute_region"):
            for region in op.regions:
                _link_positional(mod, op.results, _yields(region))
        elif op.name.startswith("cf."):
            _link_branch(mod, op)


def _yields(region: _Region, name: str = "scf.yield", skip: int = 0) -> list[list[int | None]]:
    """Operand lists of the terminators ``name`` directly inside ``region``."""
    return [[t.operand(i) for i in range(skip, len(t.uses))]
            for block in region.blocks for t in block.ops if t.name == name]


def _link_positional(mod, targets: list[int], sources: list[list[int | None]]) -> None:
    """targets[k] may alias sources[j][k] for every j; mismatches stay opaque."""
    for vals in sources:
        if len(vals) != len(targets) or None in vals:
            for t in targets:
                mod.srcs[t].append(-1)
            continue
        for t, v in zip(targets, vals):
            mod.srcs[t].append(v)


def _inits(op: _Op) -> list[int | None]:
    return [op.scope.lookup(init) for _, init in op.bindings]


def _link_for(mod, op) -> None:
    # header: %iv = %lb ... iter_args(%a = %x, ...); block args are [iv, a...]
    if len(op.regions) != 1 or not op.bindings:
        return
    body = op.regions[0]
    iter_args = body.blocks[0].args[1:]
    for targets in (iter_args, op.results):
        _link_positional(mod, targets, [_inits(op)[1:]] + _yields(body))


def _link_while(mod, op) -> None:
    if len(op.regions) != 2:
        return
    before, after = op.regions
    # before-region args <- inits and after-region yields
    _link_positional(mod, before.blocks[0].args, [_inits(op)] + _yields(after))
    # after-region args and results <- scf.condition forwarded operands
    conds = _yields(before, "scf.condition", skip=1)
    _link_positional(mod, after.blocks[0].args, conds)
    _link_positional(mod, op.results, conds)


def _link_branch(mod, op) -> None:
    if op.parent is None:
        return
    blocks = {b.label: b for b in op.parent.blocks if b.label}
    for label, args in _BRANCH_RE.findall(op.text):
        target = blocks.get(label)
        if target is None:
            raise _Unsupported("unknown block " + label)
        names = _USE_RE.findall(args.split(":")[0]) if args else []
        _link_positional(mod, target.args, [[op.scope.lookup(n) for n in names]])


def _trace(mod: _Module, value: int | None) -> set[str] | None:
    """Parameters ``value`` may point into; None if the chain is not understood."""
    if value is None:
        return None
    found, seen, todo = set(), set(), [value]
    while todo:
        v = todo.pop()
        if v in seen:
            continue
        seen.add(v)
        if v in mod.roots:
            if mod.roots[v] is not None:
                found.add(mod.roots[v])
            continue
        srcs = mod.srcs[v]
        if not srcs or -1 in srcs:     # no known origin: opaque
            return None
        todo.extend(srcs)
    return found


# --------------------------------------------------------------------------
# Kernel signature
# --------------------------------------------------------------------------

def _desc_rank(ty: str) -> int | None:
    m = re.search(r"tensordesc<\s*(?:tensor<)?\s*((?:\d+x)*)", ty)
    return m.group(1).count("x") if m else None


def _group_params(args: list[tuple[str, str]]) -> list[int] | None:
    """Indices of header args that start a Python parameter.

    A host-side tensor descriptor parameter is lowered to the descriptor plus
    ``rank`` i32 shapes and ``rank`` i64 strides, all in the header.
    """
    leaders, i = [], 0
    while i < len(args):
        leaders.append(i)
        rank = _desc_rank(args[i][1]) if "tensordesc" in args[i][1] else 0
        if rank is None:
            return None
        extra = args[i + 1:i + 1 + 2 * rank]
        if len(extra) != 2 * rank or any(not re.fullmatch(r"i\d+", t) for _, t in extra):
            return None
        i += 1 + 2 * rank
    return leaders


def _bind_kernel(mod: _Module, arg_names: list[str]) -> None:
    """Mark the kernel's pointer arguments as roots named after its parameters.

    Mapping is positional: header names follow the *last* Python variable
    bound to the value (``q = x`` renames ``%x`` to ``%q``), so they are not
    trustworthy.
    """
    kernels = [f for f in mod.funcs if not re.match(r"\s*(private|nested)\b", f[0].text)]
    if len(kernels) != 1:
        raise _Unsupported("expected exactly one public tt.func")
    for func, args in mod.funcs:
        if not func.regions:
            continue
        values = func.regions[0].blocks[0].args
        if func is not kernels[0][0]:
            for v in values:           # callee args: covered at the tt.call site
                mod.roots[v] = None
            continue
        leaders = _group_params(args)
        if leaders is not None and len(leaders) == len(arg_names):
            names = {i: arg_names[k] for k, i in enumerate(leaders)}
        elif len(args) == len(arg_names):
            names = dict(enumerate(arg_names))
        else:
            raise _Unsupported("kernel header does not match arg_names")
        for i, v in enumerate(values):
            ty = args[i][1]
            if i in names and (_POINTERISH.search(ty) or not ty):
                mod.roots[v] = names[i]


# --------------------------------------------------------------------------
# Writers
# --------------------------------------------------------------------------

def _operand_types(op: _Op) -> list[str] | None:
    """Types of the operands from the trailing ``: T, U -> R`` / ``: (T, U) -> R``."""
    parts = _split_top(op.text, ":")
    if len(parts) < 2:
        return None
    sig = parts[-1].split("{")[0].strip()
    lhs = _split_top(sig.replace("->", "\x01"), "\x01")[0] if "->" in sig else sig
    lhs = lhs.strip()
    if lhs.startswith("(") and lhs.endswith(")"):
        lhs = lhs[1:-1]
    types = _split_top(lhs) if lhs.strip() else []
    return types if len(types) == len(op.uses) else None


def _conservative_writes(mod: _Module, op: _Op) -> set[str] | None:
    """Every pointer operand of ``op`` counts as written (calls, asm, unknown ops)."""
    out = set()
    types = _operand_types(op)
    mentions_ptr = bool(_POINTERISH.search(op.text))
    for i in range(len(op.uses)):
        roots = _trace(mod, op.operand(i))
        if roots is not None:
            out |= roots
        elif types is not None:
            if _POINTERISH.search(types[i]):
                return None
        elif mentions_ptr:             # cannot tell which operand is the pointer
            return None
    return out


def _is_safe(name: str) -> bool:
    return name in _SAFE_OPS or name.startswith(_SAFE_PREFIXES) or name in _FOLLOW_OPS


def _writes(mod: _Module, op: _Op) -> set[str] | None:
    if op.name in _WRITE_OPS or _EXPERIMENTAL_WRITE.match(op.name):
        return _trace(mod, op.operand(0))
    if _is_safe(op.name):
        return set()
    return _conservative_writes(mod, op)


def written_pointer_args(ttir: str, arg_names: list[str]) -> set[str] | None:
    """Names of the kernel parameters whose memory the kernel may write.

    ``ttir`` is ``compiled_kernel.asm["ttir"]``; ``arg_names`` are the names of
    the parameters present in the compiled signature (not constexpr, not
    specialised to a constant), in order; a host tensor descriptor counts as
    one parameter.  Returns ``None`` when the IR is not fully understood: the
    caller must then treat every pointer argument as written.  Never raises.
    """
    try:
        if not isinstance(ttir, str) or not all(isinstance(a, str) for a in arg_names):
            return None
        mod = _parse(ttir)
        _bind_kernel(mod, list(arg_names))
        _link(mod)
        written: set[str] = set()
        for op in mod.ops:
            roots = _writes(mod, op)
            if roots is None:
                return None
            written |= roots
        return written
    except Exception:  # noqa: BLE001 - unknown text must never break a launch
        return None
