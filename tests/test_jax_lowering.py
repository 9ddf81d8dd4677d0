"""lazytriton.jax on a machine without a GPU: lowering for CUDA compiles
nothing and describes the call site completely; errors name the kernel."""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import lazytriton  # noqa: E402
from lazytriton import jax as ltj  # noqa: E402
from lazytriton.jax import ffi as jax_ffi  # noqa: E402
from kernels import jaxk  # noqa: E402

F32 = jax.ShapeDtypeStruct((1000,), jnp.float32)


def lower(f, *avals) -> str:
    return jax.jit(f).trace(*avals).lower(lowering_platforms=("cuda",)).as_text()


def payload(text: str) -> dict:
    m = re.search(r'payload = "((?:[^"\\]|\\.)*)"', text)
    assert m, text
    # MLIR escapes bytes as \XX (hex).
    return json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda h: chr(int(h.group(1), 16)), m.group(1)))


def mm(a, b):
    m, k = a.shape
    n = b.shape[1]
    return ltj.triton_call(a, b, m, n, k, k, 1, n, 1, n, 1, kernel=jaxk.matmul_kernel,
                           out_type=jax.ShapeDtypeStruct((m, n), jnp.float16),
                           grid=lambda meta: (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"])))


@pytest.fixture(autouse=True)
def _earlier_sites_compiled():
    """On a GPU machine every lowering compiles ahead in the background: an earlier test's sites
    (this process's) are done before a test counts compiles or records what is asked."""
    jax_ffi.compiled_ahead(timeout=300)


def test_lowering_an_8_config_matmul_compiles_nothing(cache_dir, monkeypatch):
    monkeypatch.setenv("LAZYTRITON_COMPILE_AHEAD", "0")  # a GPU machine's compiles ahead are the next test's
    before = lazytriton.stats()
    a = jax.ShapeDtypeStruct((512, 256), jnp.float16)
    b = jax.ShapeDtypeStruct((256, 384), jnp.float16)
    text = lower(mm, a, b)
    assert "stablehlo.custom_call @lazytriton_triton_call" in text
    assert "mhlo.backend_config = {" in text  # typed FFI attributes: custom call API version 4
    d = payload(text)
    assert len(d["configs"]) == 8
    for c in d["configs"]:  # every config carries its own grid
        assert c["grid"] == [triton.cdiv(512, c["kwargs"]["BM"]), triton.cdiv(384, c["kwargs"]["BN"]), 1]
    assert [a.get("buffer") for a in d["args"]][:2] == [0, 1] and d["args"][-1]["buffer"] == 2
    assert d["args"][2] == {"name": "M", "scalar": 512} and d["kernel"]["name"] == "matmul_kernel"
    assert lazytriton.stats()["compiles"] == before["compiles"]
    assert not list(Path(cache_dir).rglob("*.cubin*")) and not list(Path(cache_dir).glob("**/binaries/*"))


def test_meta_parameters_prune_configs_as_jax_triton_does():
    def f(x):
        return ltj.triton_call(x, 1000, kernel=jaxk.inc_inplace_kernel, out_type=x, input_output_aliases={0: 0},
                               grid=lambda m: (triton.cdiv(1000, m["BLOCK"]),), BLOCK=512)

    d = payload(lower(f, F32))
    assert [c["kwargs"]["BLOCK"] for c in d["configs"]] == [512, 512]  # num_warps 2 and 4 remain
    assert [c["grid"] for c in d["configs"]] == [[2, 1, 1]] * 2


def test_aliases_zeroed_outputs_and_heuristics_are_described():
    def f(x, y):
        return ltj.triton_call(x, y, 1000, kernel=jaxk.sum_diff_inplace_kernel, out_type=(x, x),
                               grid=lambda m: (triton.cdiv(1000, m["BLOCK"]),),
                               input_output_aliases={0: 0}, zeroed_outputs=lambda m: [1] if m["BLOCK"] > 500 else [])

    text = lower(f, F32, F32)
    d = payload(text)
    assert d["aliases"] == [[0, 0]]
    assert {c["kwargs"]["BLOCK"]: c["zeroed"] for c in d["configs"]} == {128: [], 1024: [1]}
    assert "output_operand_aliases" in text

    def g(x):
        return ltj.triton_call(x, 2.0, 3, True, 1024, kernel=jaxk.axpb_kernel, out_type=x,
                               grid=lambda m: (1024 // m["BLOCK"],) if m["EVEN"] else (0,))

    d = payload(lower(g, jax.ShapeDtypeStruct((1024,), jnp.float32)))
    # The heuristic (EVEN) is evaluated at trace time for the grid: 1024 % BLOCK == 0.
    assert [c["grid"][0] for c in d["configs"]] == [8, 1]
    assert [a.get("scalar") for a in d["args"][1:5]] == [2.0, 3, True, 1024]


def test_descriptor_is_deterministic_across_processes():
    # JAX's persistent cache keys on the lowered module: it must not hold
    # anything process-specific (addresses, ids).
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import jax, jax.numpy as jnp, triton\n"
            "from lazytriton import jax as ltj\nfrom kernels import jaxk\n"
            "f = lambda x: ltj.triton_call(x, 1000, kernel=jaxk.inc_inplace_kernel, out_type=x, "
            "grid=lambda m: (triton.cdiv(1000, m['BLOCK']),), input_output_aliases={0: 0})\n"
            "print(jax.jit(f).trace(jax.ShapeDtypeStruct((1000,), jnp.float32))"
            ".lower(lowering_platforms=('cuda',)).as_text())\n") % str(Path(__file__).parent)
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                           timeout=120) for _ in range(2)]
    assert all(o.returncode == 0 for o in outs), outs[0].stderr[-2000:]
    assert outs[0].stdout == outs[1].stdout


def test_vmap_lowers_to_a_sequential_loop_and_grad_says_what_to_do():
    def add(x, y):
        return ltj.triton_call(x, y, 1000, kernel=jaxk.add_kernel, out_type=x, grid=(4,), BLOCK=256)

    text = lower(jax.vmap(add), jax.ShapeDtypeStruct((3, 1000), jnp.float32),
                 jax.ShapeDtypeStruct((3, 1000), jnp.float32))
    assert "stablehlo.while" in text and "@lazytriton_triton_call" in text
    with pytest.raises(NotImplementedError, match=r"add_kernel cannot be differentiated.*custom_vjp"):
        jax.jit(jax.grad(lambda x: add(x, x).sum())).trace(F32).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize("kwargs, match", [
    (dict(grid=(1, 2, 3, 4)), "grid must be 1 to 3"),
    (dict(grid=lambda m: (-1,)), "grid must be 1 to 3 non-negative"),
    (dict(grid=(1,), input_output_aliases={3: 0}), "input_output_aliases"),
    (dict(grid=(1,), zeroed_outputs=(2,)), "zeroed_outputs"),
    (dict(grid=(1,), BLOCK=object()), "meta-parameters and scalars must be"),
])
def test_bad_calls_name_the_kernel(kwargs, match):
    kw = dict(kernel=jaxk.add_kernel, out_type=F32)
    kw.setdefault("BLOCK", 256)
    kw.update(kwargs)
    with pytest.raises((ValueError, TypeError), match=match) as exc:
        lower(lambda x: ltj.triton_call(x, x, 1000, **kw), F32)
    assert "add_kernel" in str(exc.value)


def test_unsupported_dtype_and_too_many_arguments():
    c64 = jax.ShapeDtypeStruct((10,), jnp.complex64)
    with pytest.raises(TypeError, match="add_kernel.*complex64"):
        lower(lambda x: ltj.triton_call(x, x, 10, kernel=jaxk.add_kernel, out_type=x, grid=(1,), BLOCK=16), c64)
    with pytest.raises(ValueError, match="add_kernel: out_type has 1 unaliased outputs, but 0 kernel parameters"):
        lower(lambda x: ltj.triton_call(x, x, x, 10, kernel=jaxk.add_kernel, out_type=x, grid=(1,), BLOCK=16),
              F32)
    with pytest.raises(TypeError, match="BLOCK is a tl.constexpr but receives an array"):
        lower(lambda x: ltj.triton_call(x, x, 10, kernel=jaxk.add_kernel, out_type=(x, x), grid=(1,)), F32)


def test_handler_builds_and_registers_without_a_gpu(cache_dir):
    jax_ffi.ensure_registered()
    mod = jax_ffi.handler_module()
    assert set(mod.handlers()) == {"instantiate", "execute"}
    assert isinstance(ltj.handler_stats()["executes"], int)


def test_site_rebuilt_from_descriptor_imports_module_level_kernels():
    def f(x):
        return ltj.triton_call(x, 1000, kernel=jaxk.inc_inplace_kernel, out_type=x, grid=(1,),
                               input_output_aliases={0: 0})

    d = payload(lower(f, F32))
    jax_ffi._kernels.clear()  # as in a process that never traced it
    site = jax_ffi.Site(d)
    assert site.lazy.spec.fn is jaxk.inc_inplace_kernel.fn
    assert len(site.lazy.spec.configs) == 6
    assert site.lazy.scratch_args == frozenset()  # the only output is aliased: it must be saved
    bad = json.loads(json.dumps(d))
    bad["kernel"]["qualname"] = "test.<locals>.k"
    bad["kernel"]["id"] = "nowhere"
    with pytest.raises(RuntimeError, match="local to a function"):
        jax_ffi.Site(bad)


def test_two_autotune_wrappers_of_one_function_are_two_call_sites():
    """Same source, same configs, other autotune settings (a prune hook,
    reset_to_zero): each wrapper's call site resolves its own kernel object,
    not whichever was traced first."""
    def make(**autotune):
        @triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1024)], key=["n"], **autotune)
        @triton.jit
        def twin(x, out, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out + offs, tl.load(x + offs, mask=offs < n) * 2, mask=offs < n)
        return twin

    plain = make()
    pruned = make(prune_configs_by={"early_config_prune": lambda configs, named, **kw: configs[:1]})
    zeroed = make(reset_to_zero=["out"])
    sites = []
    for kern in (plain, pruned, zeroed, plain):
        d = payload(lower(lambda x: ltj.triton_call(x, kernel=kern, out_type=x, n=1000,  # noqa: B023
                                                       grid=lambda m: (triton.cdiv(1000, m["BLOCK"]),)), F32))
        sites.append(jax_ffi.Site(d))
    assert [s.d["kernel"]["id"] == sites[0].d["kernel"]["id"] for s in sites] == [True, False, False, True]
    assert sites[0].lazy.spec.early_config_prune is None and sites[1].lazy.spec.early_config_prune is not None
    assert sites[2].lazy.spec.reset_to_zero == ["out"] and sites[3].lazy.spec.reset_to_zero == []


def _row(slot) -> tuple:
    """A slot's row of a slot table (specialize.Shape.table()), as the JAX resolver hands it over."""
    from lazytriton.model.specialize import Shape

    return Shape(("n",), (slot,)).table()[0]


def _int(t: str, annotated: bool = False):
    from lazytriton.model.specialize import Slot

    return Slot("int", int_type=t, annotated=annotated, specialize=not annotated)


def _float(t: str, annotated: bool = False):
    from lazytriton.model.specialize import Slot

    return Slot("float", float_type=t, annotated=annotated)


@pytest.mark.parametrize("value, slot, t", [
    (3, _int("i32"), "i32"), (-3, _int("i32"), "i32"), (2**40, _int("i64"), "i64"), (2**64 - 1, _int("u64"), "u64"),
    (True, "bool", "u1"), (1.5, _float("fp32"), "fp32"), (-2.25, _float("fp64"), "fp64"),
    (0.5, _float("fp16", True), "fp16"), (3.0, _float("bf16", True), "bf16"), (-7, _int("i8", True), "i8"),
    (65535, _int("u16", True), "u16"), (2, _float("fp16", True), "fp16"), (True, _int("i32", True), "i32")])
def test_slot_bits_are_the_parameter_bytes(value, slot, t):
    """The JAX handler's scalars are read from their slot table rows by the stubs' own reader (_core.slot_bits)."""
    import ml_dtypes
    from lazytriton.model.specialize import Slot

    slot = Slot("bool") if slot == "bool" else slot
    np_type = {"i32": np.int32, "i64": np.int64, "u64": np.uint64, "u1": np.uint8, "fp32": np.float32,
               "fp64": np.float64, "fp16": np.float16, "bf16": ml_dtypes.bfloat16, "i8": np.int8,
               "u16": np.uint16}[t]
    raw = np.array(value, dtype=np_type).tobytes()
    assert lazytriton._core.slot_bits(value, _row(slot)) == int.from_bytes(raw, "little")


@pytest.mark.parametrize("value, slot", [(2**31, _int("i32", True)), (-1, _int("u64", True)), (1e6, _float("fp16", True)),
                                         (1.5, _int("i32", True)), (2**31, _int("i32")), (1, None)])
def test_slot_bits_refuses_what_the_row_cannot_hold(value, slot):
    row = (99, -1, 0, 0, 1, 0, 1, 2) if slot is None else _row(slot)  # None: a kind no reader knows
    with pytest.raises(ValueError, match=r"k, argument n: .*(not what its slot reads|bad kind)"):
        lazytriton._core.slot_bits(value, row, "k, argument n")


def test_slot_bits_takes_no_buffer_or_constexpr_row():
    """A buffer (pointer, descriptor) is a call buffer's address, and a constexpr packs
    nothing: slot_bits refuses their rows, naming the argument; any kind read into one
    parameter cell is taken (the tuner's trials and the JAX call site read every scalar so)."""
    from lazytriton.model.arrays import DTYPE_IDS
    from lazytriton.model.specialize import Slot

    for slot in (Slot("ptr", dtype=DTYPE_IDS["fp32"]), Slot("constexpr")):
        with pytest.raises(ValueError, match=r"k, argument n: not a scalar's row"):
            lazytriton._core.slot_bits(0, _row(slot), "k, argument n")


def test_keyword_operand_is_bound_by_parameter_name():
    """The root of the command-buffer failure (issue 15): `cols=` names a
    non-constexpr parameter that the autotune key reads. It is an operand,
    described in its parameter's place, so the tuning launch and every C++
    launch pass the same arguments."""
    from kernels import capture

    rows, cols = 64, 1024
    f = lambda inp, dst: ltj.triton_call(inp, dst, kernel=capture.permute_rows, out_type=inp,  # noqa: E731
                                         grid=(rows,), cols=cols)
    d = payload(lower(f, jax.ShapeDtypeStruct((rows, cols), jnp.float32), jax.ShapeDtypeStruct((rows,), jnp.int32)))
    assert [a.get("buffer", a.get("scalar")) for a in d["args"]] == [0, 1, 2, cols]
    assert len(d["configs"]) == 5 and d["options"] == {}
    site = jax_ffi.Site(d)
    assert [p.name for p in site.lazy.call_params] == ["inp", "dst", "out", "cols"]
    assert site.lazy._n_call == len(d["args"])


def test_keyword_operands_conflicts_and_meta_defaults():
    from kernels import capture

    m = n = k = 128
    a = jax.ShapeDtypeStruct((m, k), jnp.float16)
    mm = lambda a, b: ltj.triton_call(a, b, kernel=capture.device_tma_matmul,  # noqa: E731
                                      out_type=jax.ShapeDtypeStruct((m, n), jnp.float16),
                                      grid=lambda meta: (m // meta["BM"], n // meta["BN"]), M=m, N=n, K=k)
    d = payload(lower(mm, a, a))
    assert [x.get("buffer", x.get("scalar")) for x in d["args"]] == [0, 1, 2, m, n, k]
    with pytest.raises(TypeError, match="given both positionally and as a keyword"):
        lower(lambda x: ltj.triton_call(x, x, 1000, kernel=jaxk.add_kernel, out_type=x, grid=(1,), BLOCK=16, n=5),
              F32)

    @triton.jit
    def with_default(x, n, out, BLOCK: tl.constexpr = 128):
        pass

    d = payload(lower(lambda x: ltj.triton_call(x, 1000, kernel=with_default, out_type=x,
                                                   grid=lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)), F32))
    assert d["args"][-1] == {"name": "BLOCK", "scalar": 128} and d["configs"][0]["grid"] == [8, 1, 1]


def test_heuristics_are_evaluated_once_at_trace_time_and_carried_to_the_compile():
    """One evaluation serves the grid and the compile (issue 15: the tuning
    path and the replay path must not disagree): the site's kernel takes the
    traced values as config values and evaluates no heuristic itself."""
    calls = []

    def even(args):
        calls.append(args["n"] % args["BLOCK"] == 0)
        return calls[-1]

    kern = triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (128, 1000)], key=["n"])(
        triton.heuristics({"EVEN": even})(jaxk.axpb_kernel.fn.fn))  # axpb's @triton.jit function
    d = payload(lower(lambda x: ltj.triton_call(x, 2.0, 3, False, 1024, kernel=kern, out_type=x,
                                                   grid=lambda m: (triton.cdiv(1024, m["BLOCK"]),)),
                         jax.ShapeDtypeStruct((1024,), jnp.float32)))
    assert calls == [True, False]
    assert [c["heuristics"] for c in d["configs"]] == [{"EVEN": True}, {"EVEN": False}]
    site = jax_ffi.Site(d)
    assert site.lazy.spec.heuristics == []
    assert [c.kwargs for c in site.lazy.spec.configs] == [{"BLOCK": 128, "EVEN": True}, {"BLOCK": 1000, "EVEN": False}]
    assert calls == [True, False]  # rebuilding the site evaluated nothing

    # An untuned kernel with heuristics: its options go into the one config.
    plain = triton.heuristics({"BLOCK": lambda a: 256, "EVEN": even})(jaxk.axpb_kernel.fn.fn)
    d = payload(lower(lambda x: ltj.triton_call(x, 2.0, 3, False, 1024, kernel=plain, out_type=x, grid=(4,),
                                                   num_warps=2), jax.ShapeDtypeStruct((1024,), jnp.float32)))
    site = jax_ffi.Site(d)
    (cfg,) = site.lazy.spec.configs
    assert cfg.kwargs == {"BLOCK": 256, "EVEN": True} and cfg.num_warps == 2 and site.options == {}


@triton.jit
def _copy_prefix(x, n, out, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n), mask=offs < n)


@pytest.mark.parametrize("n, t", [(2**31, "i64"), (2**31 + 16, "i64"), (2**40 + 3, "i64"), (2**63 + 5, "u64"),
                                  (-2**31 - 1, "i64"), (2**31 - 1, "i32")])
def test_python_ints_outside_int32_are_typed_as_triton_types_them(n, t):
    """Issue 23: a Python int beyond int32 (an 8 GiB buffer's length) beside an
    aliased output raised OverflowError from jax.typeof before anything was bound.
    Triton types it i64 (u64 from 2**63): so must the call site's shape."""
    f = lambda x, o: ltj.triton_call(x, n, o, kernel=_copy_prefix, out_type=o, grid=(4,), BLOCK=128,  # noqa: E731
                                     input_output_aliases={2: 0})
    d = payload(lower(f, F32, F32))
    assert {"name": "n", "scalar": n} in d["args"]
    site = jax_ffi.Site(d)
    bufs = ((0x7F0000000000, 4000), (0x7F0000100000, 4000), (0x7F0000100000, 4000))  # o aliased by the output
    args = site.call_args(bufs)
    shape = site.lazy._shape(site.lazy._bind_call(tuple(args), dict(site.options)))
    slot = shape.slots[shape.names.index("n")]
    assert (slot.kind, slot.int_type) == ("int", t)


def test_sites_compiled_ahead_are_asked_for_soon_in_the_order_they_were_lowered(cache_dir, monkeypatch):
    """On a GPU machine, lowering starts each site's compiles (jax.ffi.compile_ahead), asked for
    `soon` (the program's execution needs them all: they share one place in the compile queue,
    costliest first), one site after the other in the order lowered, however long each takes
    to set up. The first site is held up here."""
    import concurrent.futures as cf
    import threading
    import time
    from lazytriton.runtime.kernel import LazyKernel

    asked, done = [], threading.Event()
    monkeypatch.setattr(jax_ffi, "cuda_present", lambda: True)
    def record(self, *a, soon=False, **k):
        asked.append(self.name if soon else f"{self.name} (not soon)")  # their execution needs them all
        if len(asked) == 3:
            done.set()
        f = cf.Future()
        f.set_result(0)
        return f

    monkeypatch.setattr(LazyKernel, "compile_ahead", record)
    real = jax_ffi.Site

    class SlowFirst(real):
        def __init__(self, d):
            if d["name"] == "add_kernel":
                time.sleep(0.5)
            super().__init__(d)

    monkeypatch.setattr(jax_ffi, "Site", SlowFirst)
    monkeypatch.setattr(jax_ffi, "_sites", {})

    def program(x, y):
        grid = lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)  # noqa: E731
        a = ltj.triton_call(x, y, 1000, kernel=jaxk.add_kernel, out_type=F32, grid=grid, BLOCK=256)
        b = ltj.triton_call(a, 1000, kernel=jaxk.add_one_kernel, out_type=F32, grid=grid, BLOCK=256)
        return ltj.triton_call(b, 1000, kernel=jaxk.inc_inplace_kernel, input_output_aliases={0: 0},
                               out_type=F32, grid=grid)

    lower(program, F32, F32)
    assert done.wait(30), asked
    assert asked == ["add_kernel", "add_one_kernel", "inc_inplace_kernel"]


def test_compiled_ahead_waits_for_every_site_lowered_so_far(cache_dir, monkeypatch):
    """jax.ffi.compiled_ahead: returns once the compiles ahead of every site lowered so far are done."""
    import concurrent.futures as cf
    import threading
    from lazytriton.runtime.kernel import LazyKernel

    finished = []

    def slow_compile_ahead(self, *a, **k):
        f = cf.Future()
        threading.Timer(0.5, lambda: (finished.append(self.name), f.set_result(1))).start()
        return f

    monkeypatch.setattr(jax_ffi, "cuda_present", lambda: True)
    monkeypatch.setattr(LazyKernel, "compile_ahead", slow_compile_ahead)
    monkeypatch.setattr(jax_ffi, "_sites", {})

    def program(x, y):
        grid = lambda meta: (triton.cdiv(1000, meta["BLOCK"]),)  # noqa: E731
        a = ltj.triton_call(x, y, 1000, kernel=jaxk.add_kernel, out_type=F32, grid=grid, BLOCK=256)
        return ltj.triton_call(a, 1000, kernel=jaxk.add_one_kernel, out_type=F32, grid=grid, BLOCK=256)

    lower(program, F32, F32)
    jax_ffi.compiled_ahead(timeout=30)
    assert sorted(finished) == ["add_kernel", "add_one_kernel"]
