"""Cache keys must change whenever the result could change, and only then.

Kernels live in real module files written to tmp_path and imported with
importlib, because Triton reads kernel source from files; each version goes to
its own directory so neither bytecode nor linecache can serve stale source.
"""

import importlib.util
import itertools
import re
import sys
import textwrap

import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from lazytriton.cache import keys

_counter = itertools.count()

KERNEL_TEMPLATE = '''
import triton
import triton.language as tl
{imports}
SCALE = tl.constexpr({scale})
OUT_DTYPE = tl.{out_dtype}
ACC_DTYPE = tl.{acc_dtype}


@triton.jit
def _leaf(x):
    return x {leaf_op} 1


@triton.jit
def _inner(x):
    return (_leaf(x) * SCALE).to(ACC_DTYPE)


@triton.jit
def kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(X + offs, mask=mask)
    y = {body}
    tl.store(Y + offs, y.to(OUT_DTYPE), mask=mask)
'''

DEFAULTS = dict(imports="", scale=2, out_dtype="float32", acc_dtype="float32", leaf_op="+", body="_inner(x)")


def load_module(tmp_path, source, name=None):
    """Import ``source`` as a fresh module from its own directory."""
    name = name or f"lt_keys_mod_{next(_counter)}"
    directory = tmp_path / name
    directory.mkdir()
    path = directory / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # callee modules are imported by name
    spec.loader.exec_module(module)
    return module


def make_kernel(tmp_path, **overrides):
    return load_module(tmp_path, KERNEL_TEMPLATE.format(**{**DEFAULTS, **overrides})).kernel


SIG = {"X": "*fp32", "Y": "*fp32", "n": "i32", "BLOCK": "constexpr"}
CONSTEXPRS = {(3, ): 128}
ATTRS = {(0, ): [["tt.divisibility", 16]], (1, ): [["tt.divisibility", 16]]}
OPTIONS = {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None, "debug": False}
H100 = GPUTarget("cuda", 90, 32)
CONFIGS = [triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=8)]
DEVICE = "NVIDIA H100 80GB HBM3"


def ckey(fn, **kw):
    args = dict(signature=SIG, constexprs=CONSTEXPRS, attrs=ATTRS, options=OPTIONS, target=H100)
    args.update(kw)
    return keys.compile_key(fn, **args)


def tkey(fn, **kw):
    args = dict(signature=SIG, constexprs={}, attrs=ATTRS, configs=CONFIGS, base_options=OPTIONS, target=H100,
                device_name=DEVICE, tune_key_values=(1024, "torch.float32"))
    args.update(kw)
    return keys.tuning_key(fn, **args)


@pytest.fixture
def kernel(tmp_path):
    return make_kernel(tmp_path)


def test_keys_are_sha256_hex(kernel):
    for key in (keys.kernel_fingerprint(kernel), ckey(kernel), tkey(kernel)):
        assert re.fullmatch(r"[0-9a-f]{64}", key)


def test_unchanged_kernel_same_keys_across_calls_and_reimport(tmp_path, kernel):
    again = make_kernel(tmp_path)  # same source, new module object
    assert again is not kernel
    assert keys.kernel_fingerprint(kernel) == keys.kernel_fingerprint(kernel) == keys.kernel_fingerprint(again)
    assert ckey(kernel) == ckey(kernel) == ckey(again)
    assert tkey(kernel) == tkey(again)


def test_compile_and_tuning_keys_differ(kernel):
    assert ckey(kernel) != tkey(kernel)


@pytest.mark.parametrize("change", [
    dict(body="_inner(x) + 1"),  # the kernel's own source
    dict(leaf_op="-"),  # a function called through _inner
    dict(scale=3),  # a tl.constexpr global read by a callee
    dict(out_dtype="float16"),  # a non-constexpr global (dtype) the kernel reads
    dict(acc_dtype="float64"),  # a non-constexpr global read by a callee
])
def test_code_changes_change_keys(tmp_path, kernel, change):
    changed = make_kernel(tmp_path, **change)
    assert keys.kernel_fingerprint(changed) != keys.kernel_fingerprint(kernel)
    assert ckey(changed) != ckey(kernel)
    assert tkey(changed) != tkey(kernel)


def test_callee_in_another_module_changes_key(tmp_path):
    def build(op):
        helper = load_module(tmp_path, f"""
            import triton
            @triton.jit
            def helper(x):
                return x {op} 3
        """)
        return make_kernel(tmp_path, imports=f"from {helper.__name__} import helper", body="helper(x)")

    a, b, c = build("*"), build("*"), build("+")
    assert keys.kernel_fingerprint(a) == keys.kernel_fingerprint(b)
    assert keys.kernel_fingerprint(a) != keys.kernel_fingerprint(c)


def test_global_reassigned_after_first_key_changes_key(tmp_path):
    # fn.cache_key is memoised by Triton; the live value must still count.
    kernel = make_kernel(tmp_path)
    module = sys.modules[kernel.__module__]
    before = ckey(kernel)
    module.SCALE = tl.constexpr(5)
    assert ckey(kernel) != before
    module.SCALE = tl.constexpr(2)
    assert ckey(kernel) == before
    module.ACC_DTYPE = tl.float16
    assert ckey(kernel) != before


def test_one_call_reads_the_kernel_once_and_the_next_call_reads_it_again(tmp_path, monkeypatch):
    """keys.one_reading (a call: Resolution.run, compile_ahead): every key of the call takes one
    reading of the kernel's fingerprint and of the environment, not one per key; a global
    reassigned between two calls is seen by the second, and outside a call every key reads."""
    kernel = make_kernel(tmp_path)
    module = sys.modules[kernel.__module__]
    reads = []
    real = keys._fingerprint
    monkeypatch.setattr(keys, "_fingerprint", lambda fn: reads.append(fn) or real(fn))
    with keys.one_reading():
        first = [ckey(kernel), ckey(kernel, constexprs={(3, ): 256}), tkey(kernel)]
        with keys.one_reading():  # nested: still the call's one reading
            assert ckey(kernel) == first[0]
    assert len(reads) == 1
    module.SCALE = tl.constexpr(5)
    with keys.one_reading():
        second = [ckey(kernel), ckey(kernel, constexprs={(3, ): 256}), tkey(kernel)]
    assert len(reads) == 2 and all(a != b for a, b in zip(first, second))
    ckey(kernel)
    ckey(kernel)
    assert len(reads) == 4


def test_jit_function_as_constexpr_value_uses_its_source(tmp_path, kernel):
    def fn_with(op):
        return load_module(tmp_path, f"""
            import triton
            @triton.jit
            def epilogue(x):
                return x {op} 2
        """).epilogue

    same1, same2, other = fn_with("*"), fn_with("*"), fn_with("+")
    assert ckey(kernel, constexprs={(3, ): same1}) == ckey(kernel, constexprs={(3, ): same2})
    assert ckey(kernel, constexprs={(3, ): same1}) != ckey(kernel, constexprs={(3, ): other})


def test_autotuned_wrapper_has_same_fingerprint(kernel):
    wrapped = triton.autotune(configs=CONFIGS, key=["n"])(kernel)
    assert keys.kernel_fingerprint(wrapped) == keys.kernel_fingerprint(kernel)


def test_non_jit_rejected():
    with pytest.raises(TypeError):
        keys.kernel_fingerprint(lambda x: x)


@pytest.mark.parametrize("field, value", [
    ("signature", {**SIG, "X": "*fp16"}),
    ("signature", {**SIG, "n": "i64"}),
    ("attrs", {(1, ): [["tt.divisibility", 16]]}),
    ("attrs", {}),
    ("constexprs", {(3, ): 256}),
    ("constexprs", {(3, ): 128, (2, ): 1}),
    ("options", {**OPTIONS, "num_warps": 8}),
    ("options", {**OPTIONS, "num_stages": 4}),
    ("options", {**OPTIONS, "maxnreg": 128}),
    ("options", {**OPTIONS, "debug": True}),
    ("target", GPUTarget("cuda", 80, 32)),
])
def test_call_parts_change_compile_key(kernel, field, value):
    assert ckey(kernel, **{field: value}) != ckey(kernel)


def test_constexpr_value_types_are_not_confused(kernel):
    values = [1, 1.0, True, "1", None, (1, ), 2**40, float("nan"), float("inf"), tl.float16, tl.bfloat16]
    found = {ckey(kernel, constexprs={(3, ): v}) for v in values}
    assert len(found) == len(values)
    # tl.constexpr(1) and 1 specialise identically.
    assert ckey(kernel, constexprs={(3, ): tl.constexpr(1)}) == ckey(kernel, constexprs={(3, ): 1})


def test_mapping_order_does_not_matter(kernel):
    reordered = dict(reversed(list(OPTIONS.items())))
    assert ckey(kernel, options=reordered) == ckey(kernel)


@pytest.mark.parametrize("configs", [
    CONFIGS[:1],  # removed
    CONFIGS + [triton.Config({"BLOCK": 512}, num_warps=8)],  # added
    [CONFIGS[0], triton.Config({"BLOCK": 256}, num_warps=4)],  # changed num_warps
    [CONFIGS[0], triton.Config({"BLOCK": 256}, num_warps=8, num_stages=2)],  # changed num_stages
    [CONFIGS[0], triton.Config({"BLOCK": 256}, num_warps=8, maxnreg=128)],  # changed maxnreg
    [CONFIGS[0], triton.Config({"BLOCK": 512}, num_warps=8)],  # changed kwarg
    CONFIGS[::-1],  # reordered: the first config is the no-tuning fallback
])
def test_config_set_changes_tuning_key(kernel, configs):
    assert tkey(kernel, configs=configs) != tkey(kernel)


def test_equal_configs_give_equal_tuning_key(kernel):
    copies = [triton.Config({"BLOCK": 128}, num_warps=4), triton.Config({"BLOCK": 256}, num_warps=8)]
    assert tkey(kernel, configs=copies) == tkey(kernel)


class _OldConfig:
    """A Config without all_kwargs() (pre-3.x shape)."""

    def __init__(self, kwargs, num_warps):
        self.kwargs, self.num_warps, self.num_stages, self.num_ctas, self.maxnreg = kwargs, num_warps, 3, 1, None


def test_config_without_all_kwargs(kernel):
    old = [_OldConfig({"BLOCK": 128}, 4), _OldConfig({"BLOCK": 256}, 8)]
    changed = [_OldConfig({"BLOCK": 128}, 4), _OldConfig({"BLOCK": 256}, 4)]
    assert tkey(kernel, configs=old) != tkey(kernel, configs=changed)


@pytest.mark.parametrize("field, value", [
    ("device_name", "NVIDIA H200"),
    ("tune_key_values", (2048, "torch.float32")),
    ("tune_key_values", (1024, "torch.float16")),
    ("base_options", {**OPTIONS, "num_ctas": 2}),
    ("signature", {**SIG, "Y": "*bf16"}),
    ("attrs", {}),
    ("target", GPUTarget("cuda", 80, 32)),
])
def test_tuning_parts_change_tuning_key(kernel, field, value):
    assert tkey(kernel, **{field: value}) != tkey(kernel)


def test_triton_version_changes_keys(kernel, monkeypatch):
    before = (ckey(kernel), tkey(kernel))
    monkeypatch.setattr(triton, "__version__", triton.__version__ + "+other")
    assert ckey(kernel) != before[0]
    assert tkey(kernel) != before[1]


def test_format_version_changes_keys(kernel, monkeypatch):
    before = (ckey(kernel), tkey(kernel))
    monkeypatch.setattr(keys, "FORMAT_VERSION", keys.FORMAT_VERSION + 1)
    assert ckey(kernel) != before[0]
    assert tkey(kernel) != before[1]


INVALIDATING_VAR = "TRITON_DISABLE_LINE_INFO"  # reported by get_cache_invalidating_env_vars


def test_invalidating_env_var_changes_keys(kernel, monkeypatch):
    monkeypatch.delenv(INVALIDATING_VAR, raising=False)
    before = (ckey(kernel), tkey(kernel))
    monkeypatch.setenv(INVALIDATING_VAR, "1")
    assert INVALIDATING_VAR in keys.environment_parts()["env"]
    assert ckey(kernel) != before[0]
    assert tkey(kernel) != before[1]


def test_irrelevant_env_var_does_not_change_keys(kernel, monkeypatch):
    before = ckey(kernel)
    monkeypatch.setenv("TRITON_PRINT_AUTOTUNING", "1")
    monkeypatch.setenv("SOME_UNRELATED_VAR", "1")
    assert ckey(kernel) == before


def test_env_fallback_without_libtriton_helper(kernel, monkeypatch):
    # Simulates a Triton without get_cache_invalidating_env_vars().
    from triton._C import libtriton
    monkeypatch.delenv(INVALIDATING_VAR, raising=False)
    monkeypatch.delattr(libtriton, "get_cache_invalidating_env_vars")
    before = ckey(kernel)
    baseline = keys.environment_parts()["env"]  # whatever this machine sets already (e.g. CC)
    monkeypatch.setenv(INVALIDATING_VAR, "1")
    assert keys.environment_parts()["env"] == {**baseline, INVALIDATING_VAR: "1"}
    assert ckey(kernel) != before
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")  # location only
    assert keys.environment_parts()["env"] == {**baseline, INVALIDATING_VAR: "1"}


def test_environment_parts_fields():
    parts = keys.environment_parts()
    assert parts["triton_version"] == triton.__version__
    assert parts["format_version"] == keys.FORMAT_VERSION == 1
    assert isinstance(parts["lazytriton_version"], str) and parts["lazytriton_version"]
    assert isinstance(parts["env"], dict)


def test_key_document_matches_key(kernel):
    doc = keys.key_document("compile", kernel, SIG, CONSTEXPRS, ATTRS, OPTIONS, H100)
    assert doc["kind"] == "compile" and doc["kernel_name"] == "kernel"
    assert doc["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert keys.hash_parts(doc) == ckey(kernel)
    tdoc = keys.tuning_key_document(kernel, SIG, {}, ATTRS, CONFIGS, OPTIONS, H100, DEVICE, (1024, "torch.float32"))
    assert tdoc["configs"][0] == {"BLOCK": 128, "num_warps": 4, "num_stages": 3, "num_ctas": 1}
    assert keys.hash_parts(tdoc) == tkey(kernel)
    with pytest.raises(ValueError):
        keys.key_document("nope")
