"""Triton's front end in the compile server's workers (lazytriton.compile.recipe):
a kernel's portable recipe (its sources, first lines and the values they
read) rebuilds it in a worker that never imports the kernel's module, and
gives what the front end in this process gives: Triton's hash, the TTIR with
its source locations, the cubin byte for byte, and Triton's error messages.
What a recipe cannot carry, and a recipe a worker refuses, compile the other
way (front end here, TTIR text to the workers). Real Triton compiles for sm_90,
real server processes."""
import logging
import os
import sys
import textwrap
from pathlib import Path

import pytest
import triton
from triton.backends.compiler import GPUTarget

from lazytriton.bench import field
from lazytriton.compile import pool as compile_pool, recipe
from lazytriton.compile.compiler import Binder, Candidate, compile_all, compile_one
from lazytriton.demo_kernels import DEMO_CONFIGS, demo_matmul
from lazytriton.model.arrays import DeviceArray
from lazytriton.model.spec import kernel_spec

from kernels import gluonk, recipe_kernels as rk

TARGET = GPUTarget("cuda", 90, 32)
P = DeviceArray(0x7F0000000000, "fp16", 1 << 24)
F32 = DeviceArray(0x7F0000000000, "fp32", 1 << 24)


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A warm compile server started under this test's Triton cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    pool = compile_pool.get_pool()
    if pool is None:
        pytest.skip("LAZYTRITON_COMPILE_WORKERS=0")
    pool.close()
    assert pool.wait_ready()
    return pool


def bound(kernel, args, kwargs=None, config=0):
    spec = kernel_spec(kernel)
    cfg = spec.configs[config] if spec.configs else None
    kw = dict(cfg.all_kwargs() if cfg else {}, **(kwargs or {}))
    return spec, Candidate(config, cfg, Binder(spec, TARGET).bind(args, kw))


@pytest.fixture(scope="module")
def field_kernels(tmp_path_factory):
    """The benchmark harness's 16-kernel package (lazytriton.bench.field), its kernels module alone."""
    root = tmp_path_factory.mktemp("field")
    (root / "ltfield_recipe").mkdir()
    (root / "ltfield_recipe" / "__init__.py").write_text("")
    (root / "ltfield_recipe" / "kernels.py").write_text(textwrap.dedent(field.KERNELS))
    sys.path.insert(0, str(root))
    try:
        import ltfield_recipe.kernels as K
        yield K
    finally:
        sys.path.remove(str(root))
        for m in ("ltfield_recipe.kernels", "ltfield_recipe"):
            sys.modules.pop(m, None)


def field_cases(K):
    mm = (P, P, 512, 512, 512, 512, 1, 512, 1, 512, 1, P)
    cases = {f"field.matmul.{i}": (k, mm, 4) for i, k in enumerate(K.MATMULS)}  # config 4: a small one
    cases.update({f"field.rowwise.{i}": (k, (P, 2048, P), 0) for i, k in enumerate(K.ROWWISE)})
    cases.update({f"field.elementwise.{i}": (k, (P, P, 1 << 20, P), 0) for i, k in enumerate(K.ELEMENTWISE[:-1])})
    return cases


def local_cases():
    return {
        "helpers from another module, libdevice, constexpr and dtype globals, noinline": (rk.helpers, (F32, F32, 4096), 0),
        "do_not_specialize, a constexpr_function": (rk.unspecialized, (F32, F32, 4096, 16, {"BLOCK": 128}), None),
        "a closure": (rk.rowwise_square, (F32, 1000, F32, {"BLOCK": 1024}), None),
        "demo matmul": (demo_matmul, (P, P, P, 2048, 2048, 2048, 2048, 1, 2048, 1, 2048, 1), 3),
        "gluon": (gluonk.vec_add, (F32, F32, F32, 4096, {"BLOCK": 512, "WARPS": 4}), "warps4"),
    }


def _args(case):
    kernel, args, config = case
    kwargs = args[-1] if args and isinstance(args[-1], dict) else {}
    args = args[:-1] if kwargs else args
    if config == "warps4":
        kwargs = dict(kwargs, num_warps=4)
        config = None
    return kernel, args, kwargs, config or 0


def compile_both(server, tmp_path, monkeypatch, cases: dict) -> dict:
    """{case: (job source, worker's binary, this process's binary)}: the worker
    through the recipe, this process through Triton's own path (compile_one),
    each into its own Triton cache so that neither finds the other's."""
    jobs = {}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "worker-cache"))
    for name, case in cases.items():
        kernel, args, kwargs, config = _args(case)
        spec, c = bound(kernel, args, kwargs, config)
        b = c.bound
        source = recipe.job_source(spec.fn, b.signature, b.constexprs, b.attrs, b.options.__dict__)
        assert source is not None, f"{name}: {recipe.capture(spec.fn).why_not}"
        jobs[name] = (spec, b, source, server.submit(compile_pool.portable_job(source, TARGET)))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "here-cache"))
    out = {}
    for name, (spec, b, source, fut) in jobs.items():
        here = compile_one(spec, TARGET, b)
        try:
            worker, _ = fut.result(timeout=600)
        except compile_pool.CompileFailed as exc:
            pytest.fail(f"{name}: {exc}")
        out[name] = (source, worker, here)
    return out


def assert_same(results: dict):
    for name, (source, worker, here) in results.items():
        assert worker.metadata["hash"] == here.metadata["hash"], name  # Triton's cache key: source hash, options
        assert worker.ttir == here.ttir, name  # with its source locations (file, line, column)
        assert worker.cubin == here.cubin, name
        if not name.startswith("gluon"):  # Gluon's IR starts at TTGIR: no TTIR kept
            assert here.ttir and f'loc("{source["recipe"]["fns"][0]["file"]}"' in here.ttir, name


def test_recipe_compiles_what_the_front_end_here_compiles(server, tmp_path, monkeypatch):
    assert_same(compile_both(server, tmp_path, monkeypatch, local_cases()))


def test_recipe_compiles_the_harness_package_as_here(server, tmp_path, monkeypatch, field_kernels):
    assert_same(compile_both(server, tmp_path, monkeypatch, field_cases(field_kernels)))


def test_field_corpus_compiles_through_recipes_as_here(server, tmp_path, monkeypatch):
    """The upstream corpus (TE, Liger, fla: tests/field), where installed: one
    candidate per kernel, the first case test_field_cpu compiles."""
    sys.path.insert(0, str(Path(__file__).parent / "field"))
    try:
        from field.test_field_cpu import CASES, lazy
        from lazytriton.runtime.resolve import Resolution

        cases, skipped = {}, []
        for key in sorted(CASES):
            try:
                k = lazy(key)
            except pytest.skip.Exception as exc:
                skipped.append(f"{key}: {exc}")
                continue
            label, args, kwargs = CASES[key][0]
            full = k._bind_call(args, dict(kwargs))
            res = Resolution(k, (0,), full, 0, (1,), k._shape(full))
            res.target = TARGET
            cases[key] = res._candidates()[0]
    finally:
        sys.path.remove(str(Path(__file__).parent / "field"))
    if not cases:
        pytest.skip("no upstream package of the field corpus is installed: " + "; ".join(skipped[:2]))
    jobs = {}
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "worker-cache"))
    for key, c in cases.items():
        spec, b = lazy(key).spec, c.bound
        source = recipe.job_source(spec.fn, b.signature, b.constexprs, b.attrs, b.options.__dict__)
        if source is None:  # said once, with the reason; compiled the other way (not compared here)
            print(f"{key}: no recipe: {recipe.capture(spec.fn).why_not}")
            continue
        jobs[key] = (spec, b, source, server.submit(compile_pool.portable_job(source, TARGET)))
    assert jobs, "no kernel of the corpus has a recipe"
    print(f"field corpus through recipes: {sorted(jobs)}; {len(skipped)} not installed")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "here-cache"))
    results = {}
    for key, (spec, b, source, fut) in jobs.items():
        results[key] = (source, fut.result(timeout=600)[0], compile_one(spec, TARGET, b))
    assert_same(results)


def test_front_end_knobs_set_in_code_reach_the_worker(server, tmp_path, monkeypatch):
    """A knob Triton's front end reads, set in code: the worker's front end
    uses it too (Triton 3.5-3.9 write a knob set in code to the environment,
    whose Triton settings every job carries)."""
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    monkeypatch.setattr(triton.knobs.language, "fp32_default", "tf32x3")
    case = {"fp32 dot, fp32_default set in code": (rk.fp32_dot, (F32, F32, F32, {"BLOCK": 32}), None)}
    results = compile_both(server, tmp_path, monkeypatch, case)
    assert_same(results)
    (_, worker, _), = results.values()
    assert "inputPrecision = tf32x3" in worker.ttir


@pytest.mark.parametrize("kernel,why", [(rk.reads_a_python_function, "a constexpr holding a function"),
                                        (rk.with_repr_hook, "has a repr hook")])
def test_what_a_recipe_cannot_carry_compiles_with_its_front_end_here(server, kernel, why, caplog):
    spec = kernel_spec(kernel)
    binder = Binder(spec, TARGET)
    cands = [Candidate(i, None, binder.bind((F32, 100), {"BLOCK": b})) for i, b in enumerate((128, 256))]
    with caplog.at_level(logging.DEBUG, logger="lazytriton.compile.recipe"):
        compile_all(spec, TARGET, cands)
    assert all(c.binary is not None for c in cands), [c.error for c in cands]
    assert [c.extra["front_end"] for c in cands] == ["here", "here"]
    assert [c.extra["compiled_in"] for c in cands] == ["worker", "worker"]  # the back end still in the workers
    said = [r.getMessage() for r in caplog.records if "no portable recipe" in r.getMessage()]
    assert len(said) <= 1 and why in recipe.capture(kernel).why_not  # once per kernel (earlier tests may have said it)


def test_field_kernel_reading_a_constexpr_wrapped_function_falls_back(server, field_kernels):
    spec, c = bound(field_kernels.scaled_sub, (P, P, 1 << 20, P))
    compile_all(spec, TARGET, [c])
    assert c.binary is not None and c.extra["front_end"] == "here"
    assert "constexpr holding a function" in recipe.capture(spec.fn).why_not


def test_a_recipe_the_worker_refuses_compiles_with_its_front_end_here(server, monkeypatch, caplog):
    """A worker whose rebuilt kernel has another Triton hash than the caller's
    refuses the job; the candidate goes back to this process's front end, and
    so do the kernel's later candidates (said once)."""
    kernel = rk._rowwise(rk._square)  # its own kernel object: the refusal stays with it
    real = recipe.job_source

    def wrong_hash(fn, *a):
        src = real(fn, *a)
        return None if src is None else dict(src, hash="0" * 64)

    monkeypatch.setattr(recipe, "job_source", wrong_hash)
    spec = kernel_spec(kernel)
    binder = Binder(spec, TARGET)
    cands = [Candidate(i, None, binder.bind((F32, 1000, F32), {"BLOCK": b})) for i, b in enumerate((1024, 2048))]
    with caplog.at_level(logging.DEBUG, logger="lazytriton.compile.recipe"):
        compile_all(spec, TARGET, cands)
    assert all(c.binary is not None for c in cands), [c.error for c in cands]
    assert [c.extra["front_end"] for c in cands] == ["here", "here"]
    said = [r.getMessage() for r in caplog.records if "no portable recipe" in r.getMessage()]
    assert len(said) == 1 and "Triton hash" in said[0], said
    # Its later candidates go the other way from the start.
    b = cands[0].bound
    assert real(spec.fn, b.signature, b.constexprs, b.attrs, b.options.__dict__) is None
    assert "Triton hash" in recipe.capture(spec.fn).why_not


def test_a_recipe_that_does_not_rebuild_is_refused_not_failed(server):
    """Anything that goes wrong before triton.compile in the worker (here: a
    module the worker cannot import) is a refusal, never the candidate's error."""
    spec, c = bound(rk.helpers, (F32, F32, 4096))
    b = c.bound
    source = recipe.job_source(spec.fn, b.signature, b.constexprs, b.attrs, b.options.__dict__)
    scopes = [dict(s, names=dict(s["names"], GONE=("module", "triton.no_such_module")))
              for s in source["recipe"]["scopes"]]
    fut = server.submit(compile_pool.portable_job(dict(source, recipe=dict(source["recipe"], scopes=scopes)), TARGET))
    with pytest.raises(compile_pool.RecipeRefused, match="No module named 'triton.no_such_module'"):
        fut.result(timeout=300)


def test_triton_refuses_a_candidate_with_the_same_message_on_every_path(server, monkeypatch):
    """A candidate Triton's front end refuses (a static_assert, with its source
    line): the same error from the worker's front end, from this process's,
    and from threads (LAZYTRITON_COMPILE_WORKERS=0)."""
    def attempt(kernel, **kw):
        spec = kernel_spec(kernel)
        binder = Binder(spec, TARGET)
        cands = [Candidate(i, None, binder.bind((F32, 100), {"BLOCK": b})) for i, b in enumerate((128, 256))]
        compile_all(spec, TARGET, cands, **kw)
        assert cands[0].binary is not None and cands[1].binary is None
        return cands[1]

    worker = attempt(rk.refuses_large_blocks)
    assert worker.extra["front_end"] == "worker"
    threads = attempt(rk.refuses_large_blocks, max_workers=0)
    other = triton.jit(rk.refuses_large_blocks.fn)  # the same source, its front end here (no recipe)
    recipe.refuse(other, "this test")
    here = attempt(other)
    assert here.extra["front_end"] == "here"
    assert worker.error == here.error == threads.error
    assert worker.error.startswith("CompileTimeAssertionFailure: at 2:4:\ndef refuses_large_blocks(")
    assert "tl.static_assert(BLOCK <= 128" in worker.error
    assert "BLOCK too large for this kernel" in worker.error


HEAVY_INIT = """
import os
if os.environ.get("LT_RECIPE_TEST_OWNER") != str(os.getpid()):  # a compile worker must never get here
    with open(os.environ["LT_RECIPE_TEST_IMPORTS"], "a") as f:
        f.write(f"{os.getpid()}\\n")
    raise ImportError("ltheavy imported outside the process that owns it")
try:
    import jax  # what a kernel library imports: seconds
except ImportError:  # a venv without jax (tests/triton_versions): as long
    import time
    time.sleep(2)
"""


def test_heavy_packages_kernels_have_their_front_end_in_the_workers(server, tmp_path, monkeypatch):
    """Kernels of a package whose import takes seconds (it imports jax; the
    harness's 16 kernels): every candidate's front end runs in a worker, and
    no worker imports the package (it raises there, and logs who tried)."""
    (tmp_path / "ltheavy").mkdir()
    (tmp_path / "ltheavy" / "__init__.py").write_text(HEAVY_INIT)
    (tmp_path / "ltheavy" / "kernels.py").write_text(textwrap.dedent(field.KERNELS))
    imports = tmp_path / "imports.log"
    monkeypatch.setenv("LT_RECIPE_TEST_OWNER", str(os.getpid()))
    monkeypatch.setenv("LT_RECIPE_TEST_IMPORTS", str(imports))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    K = importlib.import_module("ltheavy.kernels")
    try:
        streams = []
        for kernel, args, first in ((K.softmax, (P, 2048, P), 0), (K.swiglu, (P, P, 1 << 20, P), 0),
                                    (K.mm_relu, (P, P, 512, 512, 512, 512, 1, 512, 1, 512, 1, P), 4)):
            spec = kernel_spec(kernel)
            binder = Binder(spec, TARGET)
            picked = spec.configs[first:first + 2]
            cands = [Candidate(i, cfg, binder.bind(args, cfg.all_kwargs())) for i, cfg in enumerate(picked)]
            compile_all(spec, TARGET, cands)
            streams += cands
        assert all(c.binary is not None for c in streams), [c.error for c in streams]
        assert [c.extra["front_end"] for c in streams] == ["worker"] * len(streams)
        assert [c.extra["compiled_in"] for c in streams] == ["worker"] * len(streams)
        assert not imports.exists(), imports.read_text()
    finally:
        for m in ("ltheavy.kernels", "ltheavy"):
            sys.modules.pop(m, None)
