"""Bad input gives a clear Python exception naming the kernel and the argument,
on a machine without a GPU too (never a crash, never a driver error first).
The GPU-side error tests live in test_gpu_runtime.py; these run anywhere, with
made-up device addresses (lazytriton.model.arrays.DeviceArray) that nothing reads."""
import numpy as np
import pytest
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

import lazytriton
from lazytriton import _core
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import DeviceArray
from lazytriton.compile.compiler import Binder, compile_one
from lazytriton.model.spec import KernelSpecError

from kernels import basic

X = DeviceArray(0x7F0000000000, "fp32", 4096)
NO_GPU = not lazytriton.gpu_available()[0]


@pytest.fixture
def add(cache_dir):
    return lazytriton.kernel(basic.add_kernel)


@pytest.mark.parametrize("bad", ["nope", [1.0, 2.0], object(), 1 + 2j, b"\0" * 16], ids=lambda v: type(v).__name__)
def test_unsupported_argument_type(add, bad):
    with pytest.raises(TypeError, match=rf"kernel add_kernel, argument y: unsupported argument type "
                                        rf"{type(bad).__name__}"):
        add[(1,)](X, bad, X, 16, BLOCK=16)


@pytest.mark.parametrize("n", [2**64, -2**63 - 1, 10**30])
def test_int_beyond_64_bits(add, n):
    with pytest.raises(ValueError, match=rf"kernel add_kernel, argument n: integer {n} does not fit 64 bits"):
        add[(1,)](X, X, X, n, BLOCK=16)


@triton.jit
def narrow_kernel(x, n: tl.int8, m: tl.uint32):
    pass


@pytest.mark.parametrize("n, m", [(300, 1), (1, -1)])
def test_int_beyond_its_annotated_type(cache_dir, n, m):
    k = lazytriton.kernel(narrow_kernel)
    with pytest.raises((ValueError, TypeError), match=r"kernel narrow_kernel, argument [nm]\b"):
        k[(1,)](X, n, m)


@triton.jit
def typed_kernel(x, n: tl.int64, flag: tl.int1, h: tl.float16, f: tl.float32):
    pass


@pytest.mark.parametrize("override, error, match", [
    (dict(n=2.0), TypeError, r"argument n: a float \(2\.0\) cannot be passed as i64"),
    (dict(flag=1.0), TypeError, r"argument flag: a float \(1\.0\) cannot be passed as u1"),
    (dict(n=None), TypeError, r"argument n: expects a number for its annotated type i64, got None"),
    (dict(h="1"), TypeError, r"argument h: expects a number for its annotated type fp16, got str"),
    (dict(f=X), TypeError, r"argument f: expects a number for its annotated type fp32, got a device array"),
    (dict(h=1e6), OverflowError, r"argument h: 1000000\.0 does not fit its annotated type fp16"),
    (dict(f=10**400), OverflowError, r"argument f: .* does not fit its annotated type fp32"),
    (dict(flag=2**64), ValueError, r"argument flag: integer .* does not fit 64 bits"),
])
def test_value_its_annotated_type_cannot_take(cache_dir, override, error, match):
    k = lazytriton.kernel(typed_kernel)
    good = dict(x=X, n=3, flag=True, h=0.5, f=0.5)
    k._stub_for(tuple(good.values()))  # a stub of this shape exists: it rejects the call, Python explains
    with pytest.raises(error, match=r"kernel typed_kernel, " + match):
        k[(1,)](*{**good, **override}.values())


def test_too_many_arguments(add):
    with pytest.raises(TypeError, match=r"kernel add_kernel: takes 5 arguments \(x, y, out, n, BLOCK\), got 6"):
        add[(1,)](X, X, X, 16, 16, 0)


@pytest.mark.parametrize("call, missing", [(lambda k: k[(1,)](X, X, X, 16), "BLOCK"),
                                           (lambda k: k[(1,)](X, X, X, BLOCK=16), "n"),
                                           (lambda k: k[(1,)](), "x")])
def test_missing_argument(add, call, missing):
    with pytest.raises(TypeError, match=rf"kernel add_kernel: missing argument '{missing}'"):
        call(add)


def test_meta_parameter_chosen_by_autotune(cache_dir):
    # Triton's Autotuner refuses a keyword its configs set too ("Conflicting meta-parameters"), and
    # num_warps/num_stages/num_ctas: every triton.Config sets them unless given None.
    k = lazytriton.kernel(basic.increment_kernel)
    with pytest.raises(TypeError, match=r"kernel increment_kernel: 'BLOCK' is chosen by its autotune configs "
                                        r"\(config 0 sets BLOCK=128\).*Conflicting meta-parameters"):
        k[(1,)](X, 16, BLOCK=128)
    with pytest.raises(TypeError, match=r"kernel increment_kernel: takes 2 arguments \(x, n\), got 3"):
        k[(1,)](X, 16, 128)
    for option in ("num_warps", "num_stages", "num_ctas"):
        with pytest.raises(TypeError, match=rf"kernel increment_kernel: {option}= is set by the autotune configs"):
            k[(1,)](X, 16, **{option: 1})


def _tuned(configs, key=("n",)):
    return lazytriton.kernel(triton.autotune(configs=configs, key=list(key))(triton.jit(_body)))


def test_launch_options_no_config_sets_pass_to_an_autotuned_kernel(cache_dir):
    """Triton merges a call's launch options with each config's Config.all_kwargs(): what
    no config sets (launch_pdl, launch_cooperative_grid, maxnreg when no config gives one)
    reaches every config's compile; lazytriton once refused them all."""
    k = _tuned([triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128})])
    for options in ({"launch_pdl": True}, {"launch_cooperative_grid": True}, {"maxnreg": 64}, {"debug": True},
                    {"launch_pdl": True, "maxnreg": 128}):
        args = k._bind_call((X, 16), dict(options))
        got, _ = k.split_extras(args)
        assert got == options
        for cfg in k.spec.configs:  # each config's compile: the call's options, then the config's own
            assert k.meta_kwargs(cfg, {"x": X, "n": 16}, got) == {**options, **cfg.all_kwargs()}
    with pytest.raises(TypeError, match=r"maxnreg= is set by the autotune configs \(config 1 has maxnreg=128"):
        _tuned([triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128}, maxnreg=128)])[(1,)](X, 16, maxnreg=64)
    # A config that leaves num_warps to the call (None): the call's num_warps then passes, as in Triton.
    k = _tuned([triton.Config({"BLOCK": 64}, num_warps=None)])
    assert k.split_extras(k._bind_call((X, 16), {"num_warps": 8}))[0] == {"num_warps": 8}


def test_keyword_a_heuristic_sets_is_overwritten(cache_dir):
    """Triton's Heuristics.run overwrites a call's keyword of the name it sets, silently (real
    code passes BLOCK_SIZE= or USE_INITIAL_STATE= to such kernels); lazytriton once refused it."""
    k = lazytriton.kernel(basic.scale_kernel)  # EVEN set by a heuristic (inside triton.autotune)
    plain = k._bind_call((X, X, 2.0, 16), {})
    assert k._bind_call((X, X, 2.0, 16), {"EVEN": True}) == plain  # the heuristic does not read it: dropped
    assert k._fast_plan(4, ("EVEN",)) is not None  # and such calls bind in C, leaving the keyword out


# B reads the call's B, as Triton lets it, in a branch a first call with a small n does not take.
@triton.heuristics({"B": lambda a: (2 * a["B"] if "B" in a else 32) if a["n"] > 100 else 1})
@triton.jit
def _reads_own_keyword(x, n, B: tl.constexpr):
    pass


@pytest.mark.parametrize("outer", [False, True], ids=["alone", "above_autotune"])
def test_a_heuristic_sees_the_keyword_it_overwrites(cache_dir, outer):
    fn = _reads_own_keyword
    if outer:  # @triton.heuristics above @triton.autotune: the heuristic runs before the autotuner
        fn = triton.heuristics(fn.values)(triton.autotune(configs=[triton.Config({}, num_warps=2)], key=["n"])(fn.fn))
    k = lazytriton.kernel(fn)
    cfg = k.spec.configs[0] if outer else None
    for n, given, want in ((16, {}, 1), (1000, {}, 32), (1000, {"B": 8}, 16), (16, {"B": 8}, 1)):
        options, _ = k.split_extras(k._bind_call((X, n), dict(given)))
        assert options == given  # kept: the heuristic reads it, so the call key holds it
        assert k.meta_kwargs(cfg, {"x": X, "n": n}, options)["B"] == want, (n, given)
    assert k._fast_plan(2, ("B",)) is False  # bound in Python: its value reaches the heuristic


def test_heuristic_above_autotune_setting_what_a_config_sets(cache_dir):
    # Triton hands the outer heuristic's value to the autotuner as the call's keyword: every call is refused.
    fn = triton.heuristics({"BLOCK": lambda a: 64})(
        triton.autotune(configs=[triton.Config({"BLOCK": 128})], key=["n"])(triton.jit(_body)))
    k = lazytriton.kernel(fn)
    for _ in range(2):  # and stays refused
        with pytest.raises(TypeError, match=r"kernel _body: its triton.heuristics, applied outside "
                                            r"triton.autotune, sets BLOCK, which its autotune configs set too"):
            k[(1,)](X, 16)


def test_unknown_keyword_argument(add):
    with pytest.raises(TypeError, match=r"kernel add_kernel: unexpected keyword argument 'bogus'"):
        add[(1,)](X, X, X, 16, BLOCK=16, bogus=1)


@pytest.mark.parametrize("option, value, error", [("num_warps", "4", TypeError), ("num_warps", 3, ValueError),
                                                  ("num_stages", -1, ValueError), ("num_ctas", 1.0, TypeError),
                                                  ("maxnreg", "128", TypeError), ("debug", "yes", TypeError),
                                                  ("ir_override", 1, TypeError)])
def test_compile_option_checked_where_given(add, option, value, error):
    # Not deep inside the first compile, with Triton's "'>' not supported between 'str' and 'int'".
    with pytest.raises(error, match=rf"kernel add_kernel: {option}={value!r}: {option} takes "):
        add[(1,)](X, X, X, 16, BLOCK=16, **{option: value})


def test_config_option_checked_when_wrapping():
    fn = triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128}, num_warps="4")],
                         key=["n"])(triton.jit(_body))
    with pytest.raises(KernelSpecError, match=r"kernel _body: config 1: num_warps='4': num_warps takes an int"):
        lazytriton.kernel(fn)


def test_tune_options_checked_where_given(cache_dir):
    with pytest.raises(TypeError, match=r"kernel add_kernel: tune_options takes a lazytriton.TuneOptions "
                                        r".*got dict \{'warmup': 1\}"):
        lazytriton.kernel(basic.add_kernel, tune_options={"warmup": 1})
    with pytest.raises(TypeError, match=r"TuneOptions: target_ms='fast': target_ms takes a number > 0"):
        lazytriton.TuneOptions(target_ms="fast")
    with pytest.raises(ValueError, match=r"TuneOptions: min_reps=10 is more than max_reps=5"):
        lazytriton.TuneOptions(min_reps=10, max_reps=5)
    options = lazytriton.TuneOptions()
    options.flush_l2 = "auto"  # set after it was made: checked when a kernel takes it
    with pytest.raises(TypeError, match=r"kernel add_kernel: tune_options: flush_l2='auto': flush_l2 takes True, "
                                        r"False or None"):
        lazytriton.kernel(basic.add_kernel, tune_options=options)
    k = lazytriton.kernel(basic.increment_kernel, tune_options=lazytriton.TuneOptions(target_ms=1, max_reps=10))
    assert k.tune_options.target_ms == 1


def _body(x, n, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), 0.0)


def test_config_pre_hook_is_rejected_when_wrapping():
    fn = triton.autotune(configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 128}, pre_hook=print)],
                         key=["n"])(triton.jit(_body))
    with pytest.raises(KernelSpecError, match=r"kernel _body: config 1 \(.*\) has a pre_hook"):
        lazytriton.kernel(fn)


@pytest.mark.parametrize("hook", ["pre_hook", "post_hook"])
def test_autotune_hooks_are_rejected_when_wrapping(hook):
    fn = triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"], **{hook: print})(triton.jit(_body))
    with pytest.raises(KernelSpecError, match=r"kernel _body: triton.autotune\(pre_hook=/post_hook=\)"):
        lazytriton.kernel(fn)


@pytest.mark.parametrize("kw, match", [(dict(key=["m"]), r"key names 'm', which is not a parameter"),
                                       (dict(key=["n"], reset_to_zero=["y"]), r"reset_to_zero names 'y'"),
                                       (dict(key=["n"], restore_value=["z"]), r"restore_value names 'z'")])
def test_autotune_names_unknown_parameter(kw, match):
    try:
        fn = triton.autotune(configs=[triton.Config({"BLOCK": 64})], **kw)(triton.jit(_body))
    except ValueError as exc:  # Triton 3.9+ checks the names itself, when decorating
        assert "not kernel arguments" in str(exc)
        return
    with pytest.raises(KernelSpecError, match=rf"kernel _body: {match}"):
        lazytriton.kernel(fn)


def test_not_a_triton_kernel():
    with pytest.raises(KernelSpecError, match="not a @triton.jit function"):
        lazytriton.kernel(_body)


# -- grids -------------------------------------------------------------------------------------

BAD_GRIDS = [(-1,), -1, (1, 1, 1, 1), (), "abc", 1.5, None, (1.5,), (None,), (2**31,), (1, -2),
             lambda meta: (-1,), lambda meta: "x"]


@pytest.fixture
def installed(add):
    """add_kernel with its call key resolved by hand to a real sm_90 binary, as a C++
    embedder installs entries: a call then reaches the grid, and only the launch
    itself would need a GPU."""
    args = (X, X, X, 16, 16)
    stub = stubgen.load_stub(add._shape(args))
    holder = _core.ResolveTable("key_only")
    key = stub.launch(holder.handle, (1,), 0, args)
    target = GPUTarget("cuda", 90, 32)
    bound = Binder(add.spec, target).bind(args, {})
    binary = compile_one(add.spec, target, bound)
    is_param = [bound.signature[n] != "constexpr" for n in add.spec.arg_names]
    add._core.install(list(key), _core.Entry(_core.Kernel(binary.cubin, binary.metadata), is_param, {"BLOCK": 16}))
    return add, args


# Stable ids (a lambda's repr has its address): xdist workers must collect the same tests.
def _grid_id(g) -> str:
    return f"callable{BAD_GRIDS.index(g)}" if callable(g) else repr(g)


@pytest.mark.parametrize("grid", BAD_GRIDS, ids=_grid_id)
def test_bad_grid_is_rejected(installed, grid):
    k, args = installed
    with pytest.raises((ValueError, TypeError)):
        k[grid](*args)


def test_bad_grid_error_names_kernel_and_grid(installed):
    k, args = installed
    for grid in BAD_GRIDS:
        with pytest.raises((ValueError, TypeError), match=r"add_kernel.*grid|grid.*add_kernel"):
            k[grid](*args)


@pytest.mark.skipif(not NO_GPU, reason="checks the machine without a GPU")
def test_launch_of_an_installed_entry_without_gpu(installed):
    k, args = installed
    with pytest.raises(lazytriton.RuntimeFailure, match="kernel add_kernel: .*(no CUDA driver|no usable CUDA device|no "
                                                        "CUDA device)"):
        k[(1,)](*args)


def test_bad_stream(add):
    match = "kernel add_kernel: stream must be an int CUstream or a stream object, got str"
    with pytest.raises(TypeError, match=match):  # Python binds BLOCK=: LazyKernel._run
        add[(1,)](X, X, X, 16, BLOCK=16, stream="default")
    with pytest.raises(TypeError, match=match):  # positional: the C launcher
        add[(1,)](X, X, X, 16, 16, stream="default")


# -- no GPU ------------------------------------------------------------------------------------

@pytest.mark.skipif(not NO_GPU, reason="checks the machine without a GPU")
def test_launch_without_gpu_says_so(add):
    for _ in range(2):  # the failed key is not remembered: the second call fails the same way
        with pytest.raises(lazytriton.RuntimeFailure, match=r"kernel add_kernel: .*(no CUDA driver|no usable CUDA "
                                                            r"device|no CUDA device)") as info:
            add[(1,)](X, X, X, 16, BLOCK=16)
        # One error, raised where the driver was asked: not the same message twice, chained.
        assert info.value.__cause__ is None and info.value.__suppress_context__
    assert not lazytriton.gpu_available()[0] and lazytriton.gpu_available()[1]


def test_host_array_is_rejected(add):
    host = np.zeros(16, np.float32)
    with pytest.raises(TypeError, match=r"kernel add_kernel, argument x: .*(host|device)"):
        add[(1,)](host, X, X, 16, BLOCK=16)


def test_host_array_is_rejected_by_a_built_stub(add):
    # The C++ DLPack path checks the device type too: a stub never takes a host pointer.
    args = (X, X, X, 16, 16)
    stub = stubgen.load_stub(add._shape(args))
    holder = _core.ResolveTable("key_only")
    assert isinstance(stub.launch(holder.handle, (1,), 0, args), tuple)
    host = np.zeros(16, np.float32)
    assert stub.launch(holder.handle, (1,), 0, (host, X, X, 16, 16)) is None
