"""C++ embedding without a GPU: bundles written from Python and read by the C++
runtime, typed launch stubs (export-cpp), the CMake package, and examples/cpp
(configures, builds, links; its runs report the missing GPU cleanly and the
ahead-of-time program never loads Python). Real cubins throughout: the
kernels are compiled for sm_90 with Triton, as on a machine with a GPU."""
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import lazytriton
from lazytriton import _core, cli, paths
from lazytriton.cpp import bundle, export as export_cpp
from lazytriton.model import specialize
from lazytriton.runtime import stubgen
from lazytriton.model.arrays import PointerArg

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "cpp"
if str(EXAMPLE) not in sys.path:
    sys.path.insert(0, str(EXAMPLE))
import example_kernels  # noqa: E402

from kernels import annotated, basic  # noqa: E402

CMAKE = shutil.which("cmake")
needs_cmake = pytest.mark.skipif(CMAKE is None, reason="needs cmake (pip install cmake)")
HAVE_GPU = lazytriton.gpu_available()[0]
without_gpu = pytest.mark.skipif(HAVE_GPU, reason="checks the behaviour on a machine without a GPU")
NO_GPU = re.compile(r"no CUDA driver|no usable CUDA device|no CUDA device")
ADD = "example_kernels:add_kernel"
SCALE = "example_kernels:scale_kernel"
N = 4096


# -- helpers shared with test_gpu_embed.py -----------------------------------------------


# The head of every C++ check program (no GPU needed): its checks print "label: message" lines.
CPP_CHECKS = r"""
#include <lazytriton/bundle.h>
#include <cstdio>
#include <string>

// One output line per check: the error's message with its newlines as " | ".
void report(const char* label, const char* what) {
  std::string s(what);
  for (size_t i; (i = s.find('\n')) != std::string::npos;) s.replace(i, 1, " | ");
  std::printf("%s: %s\n", label, s.c_str());
}
#define TRY(label, expr) try { expr; report(label, "no error"); } catch (const lt::Error& e) { report(label, e.what()); }
"""


def check_lines(out: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """A check program's "label: message" lines, by label (a label may repeat)."""
    assert out.returncode == 0, out.stdout + out.stderr
    lines: dict[str, list[str]] = {}
    for line in out.stdout.splitlines():
        key, _, value = line.partition(": ")
        lines.setdefault(key, []).append(value)
    return lines


def cmake_project(name: str, *sources: str) -> str:
    """A CMakeLists.txt building one program against the installed lazytriton::runtime."""
    return (f"cmake_minimum_required(VERSION 3.18)\nproject({name} LANGUAGES CXX)\nset(CMAKE_CXX_STANDARD 17)\n"
            f"find_package(lazytriton CONFIG REQUIRED)\nadd_executable({name} {' '.join(sources)})\n"
            f"target_link_libraries({name} PRIVATE lazytriton::runtime)\n")


def cmake_build(src: Path, build: Path, *defs: str) -> None:
    """Configure and build a CMake project against the installed lazytriton package."""
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = subprocess.run([CMAKE, "-S", str(src), "-B", str(build), *gen, f"-Dlazytriton_DIR={paths.cmake_dir()}",
                          "-DCMAKE_BUILD_TYPE=Release", *defs], capture_output=True, text=True)
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    out = subprocess.run([CMAKE, "--build", str(build)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def run(exe: Path, *args, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=exe.parent)


def needed_libraries(exe: Path) -> list[str]:
    """The names of every shared library the program loads at start (ldd: NEEDED, transitively)."""
    out = subprocess.run(["ldd", str(exe)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [line.split()[0].rsplit("/", 1)[-1] for line in out.stdout.splitlines() if line.strip()]


def compile_variant(kernel, source: str, args: tuple, kwargs: dict, *, meta: dict | None = None,
                    options: dict | None = None) -> tuple[dict, dict, bytes]:
    """(kernel description, variant, cubin) for a call compiled for sm_90 without
    a GPU (the first config's binary, untimed): what a tuned call would write."""
    from lazytriton.compile.compiler import Binder, Candidate, compile_all
    from lazytriton.compile.targets import default_target
    from lazytriton.runtime.resolve import Resolved
    from lazytriton.model.spec import kernel_spec

    spec, desc, target = kernel_spec(kernel), bundle.describe(kernel, source), default_target()
    cand = Candidate(0, None, Binder(spec, target).bind(args, kwargs))
    compile_all(spec, target, [cand])
    assert cand.binary is not None, cand.error
    kern = _core.Kernel(cand.binary.cubin, cand.binary.metadata)
    values = list(args) + [kwargs[p["name"]] for p in desc["params"][len(args):]]
    sig = cand.bound.signature
    is_param = [sig.get(p["name"], "constexpr") != "constexpr" for p in desc["params"]]
    types = [sig[p["name"]] if ip else "constexpr" for p, ip in zip(desc["params"], is_param)]
    res = Resolved(_core.Entry(kern, is_param, meta or {}), [p["name"] for p in desc["params"]], tuple(values),
                   types, meta or {}, None, ())
    variant, cubin = bundle.make_variant(desc, None, res, values, options or {}, device="compiled without a GPU")
    return desc, variant, cubin


def ptr(addr: int = 1 << 20) -> PointerArg:
    return PointerArg(addr, "fp32")


def cpp_arg(v) -> str:
    """A Python scalar as a C++ expression of the same lt::Arg kind (a bool, an integer, a double)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return f"int64_t({v})"
    return (("-" if v < 0 else "") + "HUGE_VAL") if math.isinf(v) else v.hex()  # hex: the exact double


def compiled_example_bundle(d: Path, n: int = N) -> Path:
    """The winners examples/cpp needs, compiled for sm_90."""
    bundle.write_variant(d, *compile_variant(example_kernels.add_kernel, ADD, (ptr(), ptr(), ptr(), n),
                                             {"BLOCK": 1024}))
    cfg = example_kernels.scale_kernel.configs[0]
    bundle.write_variant(d, *compile_variant(example_kernels.scale_kernel, SCALE, (ptr(), ptr(), 2.5, n),
                                             cfg.all_kwargs(), meta=dict(cfg.kwargs)))
    return d


@pytest.fixture(scope="module")
def compiled_bundle(tmp_path_factory) -> Path:
    return compiled_example_bundle(tmp_path_factory.mktemp("bundle"))


# -- Python: descriptions, variants, the bundle directory -----------------------------------


def test_describe_call_parameters_and_keys():
    add = bundle.describe(example_kernels.add_kernel)
    assert add["source"] == ADD and add["supplied"] == []
    assert [(p["name"], p["constexpr"]) for p in add["params"]] == [
        ("x", False), ("y", False), ("out", False), ("n", False), ("BLOCK", True)]
    scale = bundle.describe(example_kernels.scale_kernel)
    assert scale["supplied"] == ["BLOCK"] and [p["name"] for p in scale["params"]] == ["x", "out", "alpha", "n"]
    assert [p["name"] for p in scale["params"] if p["key"]] == ["n"]
    # @triton.heuristics reading n: n selects the binary (EVEN = n % BLOCK == 0)
    heur = bundle.describe(basic.scale_kernel)
    assert [p["name"] for p in heur["params"] if p["heuristic"]] == ["n"]
    assert set(heur["supplied"]) == {"BLOCK", "EVEN"}


def test_variant_records_specialization_and_launch(compiled_bundle):
    (v,) = bundle.Bundle(compiled_bundle).variants("add_kernel")
    assert v["kernel"] == ADD and v["arch"] == 90
    assert v["signature"] == "*fp32:16,*fp32:16,*fp32:16,i32:16"
    assert v["constexprs"] == {"BLOCK": 1024} and v["key_values"] == {}
    assert v["is_param"] == [True, True, True, True, False]
    assert v["launch"]["num_warps"] == 4 and v["launch"]["name"].startswith("add_kernel")
    cubin = (compiled_bundle / v["cubin"]).read_bytes()
    assert len(cubin) == v["cubin_size"] and cubin[:4] == b"\x7fELF"
    (s,) = bundle.Bundle(compiled_bundle).variants(SCALE)
    assert s["key_values"] == {"n": N} and s["meta"] == {"BLOCK": 256}


def test_specialization_rules_match_triton():
    p = {"align": True, "specialize": True, "annotation": ""}
    assert [bundle.arg_spec(p, ptr(a)) for a in (4096, 4100)] == ["16", ""]
    assert [bundle.arg_spec(p, v) for v in (1, 32, 33, 0, -16)] == ["1", "16", "", "16", "16"]
    assert bundle.arg_spec({**p, "specialize": False}, 32) == ""
    assert bundle.arg_spec({**p, "align": False}, ptr(4096)) == ""
    assert [bundle.arg_type(p, v, "x") for v in (5, 2**31, 2**63, 2.5, True, ptr())] == [
        "i32", "i64", "u64", "fp32", "u1", "*fp32"]
    assert bundle.arg_type({**p, "annotation": "i64"}, 5, "x") == "i64"


def test_rewriting_a_variant_replaces_it(tmp_path):
    args = (ptr(), ptr(), ptr(), 4096)
    for _ in range(2):
        bundle.write_variant(tmp_path, *compile_variant(example_kernels.add_kernel, ADD, args, {"BLOCK": 1024}))
    assert len(bundle.Bundle(tmp_path).variants()) == 1
    # another specialization (an unaligned pointer, n not % 16) is another variant
    bundle.write_variant(tmp_path, *compile_variant(example_kernels.add_kernel, ADD,
                                                    (ptr(), ptr(4100), ptr(), 4097), {"BLOCK": 1024}))
    sigs = sorted(v["signature"] for v in bundle.Bundle(tmp_path).variants())
    assert sigs == ["*fp32:16,*fp32,*fp32:16,i32", "*fp32:16,*fp32:16,*fp32:16,i32:16"]
    assert len(list((tmp_path / "cubins").iterdir())) == 2  # unaligned: no vector loads, another binary


def test_bind_checks_names():
    desc = bundle.describe(example_kernels.scale_kernel)
    assert bundle.bind(desc, (1, 2, 3.0), {"n": 4, "num_warps": 2}) == ([1, 2, 3.0, 4], {"num_warps": 2})
    with pytest.raises(TypeError, match="scale_kernel.*BLOCK.*configs"):
        bundle.bind(desc, (1, 2, 3.0, 4), {"BLOCK": 8})
    with pytest.raises(TypeError, match="scale_kernel: missing argument 'n'"):
        bundle.bind(desc, (1, 2, 3.0), {})


def test_cli_lists_bundle(compiled_bundle, capsys):
    assert cli.main(["bundle", str(compiled_bundle)]) == 0
    out = capsys.readouterr().out
    assert f"{ADD}  (1 winner)" in out and "sm_90 *fp32:16,*fp32:16,*fp32:16,i32:16 BLOCK=1024" in out
    assert "BLOCK=256, num_warps=" in out


def test_cli_cmake_dir_holds_the_package_config(tmp_path):
    out = subprocess.run([sys.executable, "-m", "lazytriton", "--cmake-dir"], capture_output=True, text=True,
                         cwd=tmp_path)  # outside the checkout: the installed package
    assert out.returncode == 0, out.stderr
    d = Path(out.stdout.strip())
    assert (d / "lazytritonConfig.cmake").exists() and (d / "lazytritonTargets.cmake").exists()


# -- export-cpp --------------------------------------------------------------------------------


def test_export_cpp_writes_typed_launch_functions():
    desc = bundle.describe(basic.scale_kernel, "kernels.basic:scale_kernel")
    name, header, source = export_cpp.generate(desc, "*fp32,*fp32,fp32,i32", {})
    assert name == "launch_scale_kernel.h"
    assert ("void launch_scale_kernel(lt::Stream stream, lt::Dim3 grid, lt::DevicePtr x, lt::DevicePtr out, "
            "float alpha, int32_t n);") in header
    assert "lt::BundleKernel launch_scale_kernel_handle(const lt::Bundle& bundle);" in header
    assert 'kSource = "kernels.basic:scale_kernel"' in source and "{x, out, alpha, n}" in source
    _, _, src = export_cpp.generate(bundle.describe(example_kernels.add_kernel, ADD), "*fp32,*fp32,*fp32,i64",
                                    {"BLOCK": 1024, "num_warps": 8}, "add")
    assert '{{"BLOCK", int64_t{1024}}, {"num_warps", int64_t{8}}}' in src and "void add(" in src


def test_export_cpp_takes_half_scalars_as_double():
    # Rounded once from the caller's double, as Triton's launcher does (via float it could round twice).
    desc = bundle.describe(annotated.store_scalars, "kernels.annotated:store_scalars")
    _, header, _ = export_cpp.generate(desc, STORE_SIG, {})
    assert "double h, double b, float f, double d, int64_t n);" in header


@pytest.mark.parametrize("sig,cx,err", [
    ("*fp32,*fp32,i32", {}, "has 3 types but the kernel takes 4 runtime arguments \\(x, out, alpha, n\\)"),
    ("*fp32,*fp32,fp32,i32", {"BLOCK": 64}, "BLOCK is chosen by its autotune configs"),
    ("*fp32,*fp32,fp32,i32", {"bogus": 1}, "no parameter named 'bogus'"),
    ("*fp32,*fp32,fp32,int", {}, "argument n: unknown type 'int'"),
])
def test_export_cpp_rejects_bad_signatures(sig, cx, err):
    with pytest.raises(ValueError, match=err):
        export_cpp.generate(bundle.describe(example_kernels.scale_kernel), sig, cx)


def test_cpp_takes_what_a_heuristic_overwrites_and_options_no_config_sets():
    # Triton's Heuristics.run overwrites a call's EVEN (its heuristic reads n and BLOCK only): the C++
    # face drops it; launch options no autotune config sets pass to every config, as in Triton.
    desc = bundle.describe(basic.scale_kernel, "kernels.basic:scale_kernel")
    assert desc["overwritten"] == ["EVEN"]
    given = {"EVEN": True, "launch_pdl": True, "launch_cooperative_grid": True}
    _, header, src = export_cpp.generate(desc, "*fp32,*fp32,fp32,i32", given)
    assert '{{"launch_cooperative_grid", true}, {"launch_pdl", true}}' in src and "EVEN" not in src + header
    x = PointerArg(1 << 20, "fp32")
    assert bundle.bind(desc, (x, x, 2.0, 16), given) == ([x, x, 2.0, 16], {"launch_pdl": True,
                                                                            "launch_cooperative_grid": True})
    with pytest.raises(ValueError, match="BLOCK is chosen by its autotune configs"):  # a config's: refused
        export_cpp.generate(desc, "*fp32,*fp32,fp32,i32", {"BLOCK": 64})


def test_export_cpp_needs_constexpr_values_and_renames_cpp_keywords():
    with pytest.raises(ValueError, match="constexpr BLOCK needs a value"):
        export_cpp.generate(bundle.describe(example_kernels.add_kernel), "*fp32,*fp32,*fp32,i32", {})
    assert [export_cpp._cpp_name(n) for n in ("x", "new", "stream", "grid")] == ["x", "new_", "stream_", "grid_"]
    assert export_cpp.parse_constexpr("B=1024") == ("B", 1024)
    assert export_cpp.parse_constexpr("F=True") == ("F", True) and export_cpp.parse_constexpr("s=abc") == ("s", "abc")


def test_cli_export_cpp(tmp_path, capsys):
    rc = cli.main(["export-cpp", ADD, "--signature", "*fp32,*fp32,*fp32,i32", "--constexpr", "BLOCK=1024",
                   "--out-dir", str(tmp_path), "--path", str(EXAMPLE)])
    assert rc == 0
    assert (tmp_path / "launch_add_kernel.h").exists() and (tmp_path / "launch_add_kernel.cc").exists()
    assert cli.main(["export-cpp", ADD, "--signature", "*fp32", "--out-dir", str(tmp_path)]) == 1
    assert "error: kernel add_kernel" in capsys.readouterr().err


# -- the example, built against the installed package --------------------------------------


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    build = tmp_path_factory.mktemp("example-build")
    cmake_build(EXAMPLE, build)
    return build


def test_example_builds_and_aot_program_has_no_python(example):
    aot = example / "vector_add_aot"
    assert aot.exists()
    libs = needed_libraries(aot)
    assert "liblazytriton.so" in libs and not [n for n in libs if "python" in n], libs
    if (example / "vector_add_lazy").exists():
        assert [n for n in needed_libraries(example / "vector_add_lazy") if n.startswith("libpython")]


@without_gpu
def test_aot_example_reports_missing_gpu_and_loads_no_python(example, compiled_bundle):
    out = run(example / "vector_add_aot", compiled_bundle, N, env={"LD_DEBUG": "libs"})
    log = out.stderr
    assert out.returncode == 2, log[-3000:]
    assert re.search(r"^error: lazytriton: (" + NO_GPU.pattern + ")", log, re.M), log[-3000:]
    assert "libpython" not in log  # nothing loaded Python, not even by dlopen


def test_aot_example_without_bundle_is_a_clear_error(example, tmp_path):
    out = run(example / "vector_add_aot", tmp_path / "missing", N)
    assert out.returncode == 2
    assert "error: kernel example_kernels:scale_kernel: not in bundle" in out.stderr
    assert "(it has no manifest.json)" in out.stderr


@without_gpu
def test_lazy_example_describes_through_python_then_reports_missing_gpu(example, tmp_path):
    lazy = example / "vector_add_lazy"
    if not lazy.exists():
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    out = run(lazy, tmp_path / "empty", N)
    assert out.returncode == 2, out.stderr
    assert NO_GPU.search(out.stderr) and "error:" in out.stderr


LAZY_BIND = CPP_CHECKS + r"""
#include <lazytriton/embed.h>

// Lazy mode binding signatures no winner has yet: their slot tables come from Python.
int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  lt::enable_lazy(b, {{argv[2]}});
  float* p = reinterpret_cast<float*>(uintptr_t(1) << 20);
  auto add = b.kernel("example_kernels:add_kernel", "*fp32,*fp32,*fp32,i64", {{"BLOCK", 1024}});
  std::printf("add: %s\n", add.specialization({p, p + 1, p, int64_t(1) << 40}).c_str());
  auto scale = b.kernel("example_kernels:scale_kernel", "*fp32,*fp32,fp32,i32");
  std::printf("scale: %s\n", scale.specialization({p, p, 2.5, 1}).c_str());
  TRY("unannotated fp16", b.kernel("example_kernels:scale_kernel", "*fp32,*fp32,fp16,i32"));
  std::printf("describes: %llu\n", (unsigned long long)lt::lazy_stats().describes);
}
"""


@needs_cmake
def test_lazy_mode_binds_a_new_signature_to_pythons_slot_table(tmp_path, example):
    if not (example / "vector_add_lazy").exists():
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    src = tmp_path / "src"
    src.mkdir()
    (src / "lazy_bind.cc").write_text(LAZY_BIND)
    (src / "CMakeLists.txt").write_text(cmake_project("lazy_bind", "lazy_bind.cc").replace(
        "lazytriton::runtime", "lazytriton::embed"))
    cmake_build(src, src / "build")
    got = check_lines(run(src / "build" / "lazy_bind", tmp_path / "empty", EXAMPLE))
    # The rows Python reads the signature's types as (cpp/embed.py slot_table): as the stubs key such a call.
    assert got["add"] == ["*fp32:16,*fp32,*fp32:16,i64:16"]
    assert got["scale"] == ["*fp32:16,*fp32:16,fp32,i32:1"]
    assert "argument alpha: an unannotated float is passed as fp32, not fp16" in got["unannotated fp16"][0]
    assert got["describes"] == ["2"]


# -- the C++ API's checks (no GPU needed) --------------------------------------------------------

API_TEST = CPP_CHECKS + r"""
#include <fstream>

int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  std::printf("kernels: %zu, variants: %zu, lazy: %d\n", b.kernel_names().size(), b.variant_count(), b.lazy());
  auto add = b.kernel("add_kernel", "*fp32,*fp32,*fp32,i32", {{"BLOCK", 1024}});  // by function name
  auto scale = b.kernel("example_kernels:scale_kernel", "*fp32, *fp32, fp32, i32");
  float* p = reinterpret_cast<float*>(uintptr_t(1) << 20);
  std::printf("spec1: %s\n", add.specialization({p, p + 1, p, 4096}).c_str());
  std::printf("spec2: %s\n", add.specialization({p, p, lt::DevicePtr(1ull << 20), 1}).c_str());
  std::printf("spec3: %s\n", scale.specialization({p, p, 2.5f, -32}).c_str());
  std::printf("args: %s %s %s %s\n", scale.arg_names()[0].c_str(), scale.arg_names()[1].c_str(),
              scale.arg_names()[2].c_str(), scale.arg_names()[3].c_str());
  TRY("i64 value", add.specialization({p, p, p, int64_t(1) << 40}));
  TRY("float for int", add.specialization({p, p, p, 2.0}));
  TRY("int for float", scale.specialization({p, p, 2, 7}));
  TRY("int for pointer", scale.specialization({p, 4096ull, 2.0, 7}));
  TRY("dtype", scale.specialization({p, reinterpret_cast<double*>(p), 2.0, 7}));
  TRY("count", scale.specialization({p, p, 2.0}));
  TRY("no winner", b.kernel("example_kernels:add_kernel", "*fp32,*fp32,*fp32,i32", {{"BLOCK", 512}}));
  TRY("no winner type", b.kernel("example_kernels:add_kernel", "*fp32,*fp32,*fp32,i64", {{"BLOCK", 1024}}));
  TRY("signature count", b.kernel("add_kernel", "*fp32,*fp32,i32", {{"BLOCK", 1024}}));
  TRY("suffix", b.kernel("add_kernel", "*fp32:16,*fp32,*fp32,i32", {{"BLOCK", 1024}}));
  TRY("dtype name", b.kernel("add_kernel", "*fp32,*f32,*fp32,i32", {{"BLOCK", 1024}}));
  TRY("supplied", b.kernel("scale_kernel", "*fp32,*fp32,fp32,i32", {{"BLOCK", 256}}));
  TRY("unknown param", b.kernel("scale_kernel", "*fp32,*fp32,fp32,i32", {{"nope", 1}}));
  TRY("missing constexpr", b.kernel("add_kernel", "*fp32,*fp32,*fp32,i32"));
  TRY("not a constexpr", b.kernel("add_kernel", "*fp32,*fp32,i32", {{"BLOCK", 1024}, {"x", 3}}));
  TRY("unknown kernel", b.kernel("mod:nope", "*fp32"));
  if (lt::driver_available())  // the pointers are made up: never launch them on a real GPU
    report("launch", "skipped: a GPU is present");
  else
    TRY("launch", add.launch(nullptr, lt::Dim3{1}, {p, p, p, 4096}));
  lt::Meta m("k", {{"BLOCK", 128}, {"EVEN", true}, {"s", "x"}});
  std::printf("meta: %lld %lld %s\n", (long long)m["BLOCK"], (long long)m["EVEN"], m.at("s").repr().c_str());
  TRY("meta missing", m["BM"]);
  TRY("meta type", m["s"]);
  std::printf("constants: %s %s %s %s\n", lt::Constant(2.0).repr().c_str(), lt::Constant(nullptr).repr().c_str(),
              lt::Constant(false).repr().c_str(), lt::Constant(int64_t(-3)).repr().c_str());
  // argv[2]: the bundle with its add_kernel variant's slot table edited; the binder follows the rows.
  auto edited = lt::Bundle::open(argv[2]).kernel("add_kernel", "*fp32,*fp32,*fp32,i32", {{"BLOCK", 1024}});
  std::printf("edited1: %s\n", edited.specialization({p, p + 1, p, 4096}).c_str());
  std::printf("edited2: %s\n", edited.specialization({p, p, p, 1}).c_str());
  for (int i = 3; i < argc; ++i) TRY("manifest", lt::Bundle::open(argv[i]));
}
"""

API_CMAKE = cmake_project("api_test", "api_test.cc")


@pytest.fixture(scope="module")
def api_output(tmp_path_factory, compiled_bundle) -> dict:
    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    src = tmp_path_factory.mktemp("api-src")
    (src / "api_test.cc").write_text(API_TEST)
    (src / "CMakeLists.txt").write_text(API_CMAKE)
    build = src / "build"
    cmake_build(src, build)
    edited = edited_bundle(compiled_bundle, src / "edited", EDITED_ROWS)
    manifest = json.loads((compiled_bundle / "manifest.json").read_text())
    wrong_row = json.loads(json.dumps(manifest))
    wrong_row["kernels"][ADD]["variants"][0]["table"][0][0] = 1  # an int's row for a pointer
    bad = []
    for i, text in enumerate(['{"format": "lazytriton-bundle", "version": 2, "kernels": {"a": [1, 2',
                              '{"format": "other", "version": 2}', '{"format": "lazytriton-bundle", "version": 7}',
                              '[' * 100000, '{"format": "lazytriton-bundle", "version": 2, "kernels": {"m:k": {}}}',
                              json.dumps(old_manifest(manifest)), json.dumps(wrong_row)]):
        d = src / f"bad{i}"
        d.mkdir()
        (d / "manifest.json").write_text(text)
        bad.append(d)
    return check_lines(run(build / "api_test", compiled_bundle, edited, *bad))


# add_kernel(x, y, out, n, BLOCK)'s slot table with x's alignment and n's % 16 not keyed: rows as
# specialize.Shape.table() writes them (kind, dtype, code, annotated, specialize, in_key, divisibility,
# float_code), fp32 = dtype 11.
EDITED_ROWS = [[0, 11, 0, 0, 0, 0, 1, 2], [0, 11, 0, 0, 1, 0, 1, 2], [0, 11, 0, 0, 1, 0, 1, 2],
               [1, -1, 0, 0, 1, 0, 0, 2], [4, -1, 0, 0, 1, 0, 1, 2]]


def edited_bundle(src: Path, dst: Path, rows: list) -> Path:
    """A copy of bundle `src` whose add_kernel variant carries the slot table `rows`."""
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    (variant,) = manifest["kernels"][ADD]["variants"]
    assert len(variant["table"]) == len(rows) and variant["table"] != rows
    variant["table"] = rows
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def old_manifest(manifest: dict) -> dict:
    """`manifest` as lazytriton wrote bundles before their variants carried slot tables (format version 1)."""
    old = json.loads(json.dumps(manifest))
    old["version"] = 1
    for k in old["kernels"].values():
        for v in k["variants"]:
            del v["table"]
    return old


def test_cpp_reads_the_bundle(api_output):
    assert api_output["kernels"] == ["2, variants: 2, lazy: 0"]
    assert api_output["args"] == ["x out alpha n"]


def test_cpp_specialization_follows_triton(api_output):
    assert api_output["spec1"] == ["*fp32:16,*fp32,*fp32:16,i32:16"]
    assert api_output["spec2"] == ["*fp32:16,*fp32:16,*fp32:16,i32:1"]
    assert api_output["spec3"] == ["*fp32:16,*fp32:16,fp32,i32:16"]


@pytest.mark.parametrize("label,message", [
    ("i64 value", "kernel add_kernel: argument n: 1099511627776 is i64 under Triton's rules"),
    ("float for int", "kernel add_kernel: argument n: expects an integer (i32), got a float"),
    ("int for float", "kernel scale_kernel: argument alpha: expects a float (fp32), got an integer"),
    ("int for pointer", "argument out: expects a device pointer (*fp32), got an integer; wrap a CUdeviceptr"),
    ("dtype", "kernel scale_kernel: argument out: a pointer to fp64 where the signature says *fp32"),
    ("count", "kernel scale_kernel: takes 4 runtime arguments (x, out, alpha, n), got 3"),
    ("signature count", "has 3 types but the kernel takes 4 runtime arguments (x, y, out, n)"),
    ("suffix", "give types only; the specialization (:16, :1) comes from the arguments"),
    ("dtype name", "kernel add_kernel: argument y: unknown element type in '*f32'"),
    ("supplied", "kernel scale_kernel: BLOCK is chosen by the kernel's autotune configs or heuristics"),
    ("unknown param", "kernel scale_kernel: no parameter named 'nope' (parameters: x, out, alpha, n)"),
    ("missing constexpr", "kernel add_kernel: constexpr BLOCK needs a value"),
    ("not a constexpr", "argument x is not a constexpr: pass it at launch"),
    ("unknown kernel", "kernel mod:nope: not in bundle"),
    ("meta missing", "kernel k: no meta-parameter 'BM' (it has: BLOCK, EVEN, s)"),
    ("meta type", "constant 'x' is not an integer"),
])
def test_cpp_errors_name_kernel_and_argument(api_output, label, message):
    (got,) = api_output[label]
    assert message in got, got


def test_cpp_without_winner_lists_the_bundle(api_output):
    (got,) = api_output["no winner"]
    assert "kernel add_kernel: bundle" in got and "has no winner for signature *fp32,*fp32,*fp32,i32 BLOCK=512" in got
    assert "its winners are: |   sm_90 *fp32:16,*fp32:16,*fp32:16,i32:16 BLOCK=1024 (tuned on compiled without a GPU)" in got
    assert "lt::enable_lazy" in got
    assert "has no winner for signature *fp32,*fp32,*fp32,i64 BLOCK=1024" in api_output["no winner type"][0]


def test_cpp_bad_manifests_are_errors_not_crashes(api_output):
    got = api_output["manifest"]
    assert len(got) == 7
    assert "manifest.json: invalid JSON at byte" in got[0]
    assert "not a lazytriton bundle (format 'other')" in got[1]
    assert "bundle format version 7" in got[2]
    assert "nested too deeply" in got[3]
    assert "kernel m:k: missing field 'name'" in got[4]
    assert "variant.table[0]: the row does not read the argument's type *fp32" in got[6]


def test_cpp_refuses_a_bundle_without_slot_tables_naming_it(api_output, compiled_bundle, tmp_path):
    # A version 1 bundle (written before variants carried their slot tables): refused, naming the
    # bundle and how to re-export it, by the C++ reader and by Python alike.
    (got,) = [m for m in api_output["manifest"] if "older lazytriton" in m]
    assert re.search(r"bundle \S+/bad5 was written by an older lazytriton \(bundle format version 1; this one "
                     r"reads version 2, whose variants carry their call's slot table\): re-export it \(add its "
                     r"kernels again with lazytriton.cpp.Bundle\(dir\).add\(...\)", got), got
    old = tmp_path / "old"
    old.mkdir()
    (old / "manifest.json").write_text(json.dumps(old_manifest(json.loads(
        (compiled_bundle / "manifest.json").read_text()))))
    with pytest.raises(ValueError, match=f"bundle {old} was written by an older lazytriton .*re-export it"):
        bundle.Bundle(old).manifest()
    with pytest.raises(ValueError, match="re-export it"):  # a writer does not mix the formats either
        bundle.write_variant(old, *compile_variant(example_kernels.add_kernel, ADD, (ptr(), ptr(), ptr(), N),
                                                   {"BLOCK": 1024}))
    assert "table" not in json.loads((old / "manifest.json").read_text())["kernels"][ADD]["variants"][0]


def test_cpp_binder_walks_the_manifests_slot_table_as_the_python_stub_does(api_output):
    # The edited rows are what the C++ binder follows, and the Python stub given the same rows keys
    # the same calls alike: a disagreement between the two readers of a row fails here.
    shape = specialize.Shape(("x", "y", "out", "n", "BLOCK"), (
        specialize.Slot("ptr", dtype=11, specialize=False), specialize.Slot("ptr", dtype=11),
        specialize.Slot("ptr", dtype=11), specialize.Slot("int", int_type="i32", divisibility=False),
        specialize.Slot("constexpr")))
    assert [list(r) for r in shape.table()] == EDITED_ROWS
    for label, args in (("edited1", (ptr(), ptr((1 << 20) + 4), ptr(), 4096)), ("edited2", (ptr(),) * 3 + (1,))):
        key = stubgen.generic_stub(shape).key(args + (1024,))
        specs = [stub_spec(shape.slots[i], key[0] >> (2 * i) & 3) for i in range(4)]
        assert api_output[label] == [",".join(t + (":" + s if s else "") for t, s in zip(
            ["*fp32", "*fp32", "*fp32", "i32"], specs))], (label, specs)
    assert api_output["edited1"] == ["*fp32,*fp32,*fp32:16,i32"]
    assert api_output["edited2"] == ["*fp32,*fp32:16,*fp32:16,i32:1"]


def stub_spec(slot, bits: int) -> str:
    """A slot's 2 key bits as a signature's specialization suffix."""
    if slot.kind == "ptr":
        return "16" if bits & 1 else ""
    if slot.kind == "int":
        return "1" if bits & 1 else "16" if bits & 2 else ""
    return ""


@without_gpu
def test_cpp_launch_without_gpu_is_an_error(api_output):
    (got,) = api_output["launch"]
    assert NO_GPU.search(got), got


def test_cpp_meta_and_constants(api_output):
    assert api_output["meta"] == ["128 1 'x'"]
    assert api_output["constants"] == ["2.0 None False -3"]


# -- annotated scalars (n: tl.int64, x: tl.float16): Triton's types and specialization -------------

STORE = "kernels.annotated:store_scalars"
SCALE16 = "kernels.annotated:scale_fp16_kernel"
STORE_SIG = "*fp32,*fp64,fp16,bf16,fp32,fp64,i64"
# (h: fp16, b: bf16, f: fp32, d: fp64, n: i64): ints and bools for the float parameters, the int
# annotated n == 1, % 16 and given a bool, fp16 values next to its largest
ANNOTATED_ROWS = [(1.5, 1.5, 1.5, 1.5, 7), (3, 7, 2**40, -2, 7), (True, False, True, True, True),
                  (1.0, 1.0, 1.0, 1.0, 1), (1.0, 1.0, 1.0, 1.0, 32), (1.0, 1.0, 1.0, 1.0, 0),
                  (1.0, 1.0, 1.0, 1.0, False), (65519.99, -1e300, 1e300, 1.0, 3), (-math.inf, 1.0, 1.0, 1.0, 3)]
FP16_OVERFLOW = [65520.0, -65520.0, 70000, 2.0**100]  # round beyond 65504: Triton's launcher raises OverflowError
PROBE = "kernels.annotated:scalar_probe"
PROBE_SIG = "i32,i32,i32,i64,i64,u8,u1,fp16,bf16,fp32,fp64"
# scalar_probe(plain, nospec, noalign, i64, noalign_i64, u8, b1: tl.int1, h, bf, f, d), in PROBE_SIG's types
PROBE_ROWS = [(1,) * 11, (32,) * 11, (33,) * 11, (0,) * 11, (5, 5, 5, True, False, True, True, True, False, True, True)]


def store_args(row) -> tuple:
    return (ptr(), PointerArg(1 << 20, "fp64"), *row)


def python_signature(kernel, args) -> str:
    """The specialized signature bundle.py records for a call (e.g. "*fp32:16,fp16,i64:16")."""
    params = bundle.describe(kernel)["params"]
    types = [bundle.arg_type(p, v, p["name"]) for p, v in zip(params, args)]
    return bundle.signature_text(types, [bundle.arg_spec(p, v) for p, v in zip(params, args)])


@pytest.fixture(scope="module")
def annotated_bundle(tmp_path_factory) -> Path:
    """Winners recorded from ints for the float parameters (and n == 1, alpha = 3 in the key)."""
    d = tmp_path_factory.mktemp("annotated-bundle")
    bundle.write_variant(d, *compile_variant(annotated.store_scalars, STORE, store_args((3, 7, 2, 2**53 + 1, 1)), {}))
    cfg = annotated.scale_fp16_kernel.configs[0]
    bundle.write_variant(d, *compile_variant(annotated.scale_fp16_kernel, SCALE16, (ptr(), ptr(), 3, 100),
                                             cfg.all_kwargs(), meta=dict(cfg.kwargs)))
    bundle.write_variant(d, *compile_variant(annotated.scalar_probe, PROBE, PROBE_ROWS[1], {}))
    return d


def test_annotated_scalars_are_recorded_in_their_types(annotated_bundle):
    (v,) = bundle.Bundle(annotated_bundle).variants(STORE)
    assert v["signature"] == "*fp32:16,*fp64:16,fp16,bf16,fp32,fp64,i64"  # n == 1 stays a parameter
    assert v["is_param"] == [True] * 7
    (s,) = bundle.Bundle(annotated_bundle).variants(SCALE16)
    assert s["signature"] == "*fp32:16,*fp32:16,fp16,i32" and s["meta"] == {"BLOCK": 128}
    assert s["key_values"] == {"alpha": 3.0} and isinstance(s["key_values"]["alpha"], float)  # keyed as converted


@pytest.mark.parametrize("row", PROBE_ROWS + [(True,) * 11, (False,) * 11,
                                              (2**40, 48, 2**40, 2**40, 2**40, 255, 1, 2.5, 2.5, 2.5, 2.5)])
def test_bundle_specialization_matches_tritons_binder(row):
    from lazytriton.compile.compiler import Binder
    from lazytriton.model.spec import kernel_spec
    from triton.backends.compiler import GPUTarget

    desc = bundle.describe(annotated.scalar_probe)
    bound = Binder(kernel_spec(annotated.scalar_probe), GPUTarget("cuda", 90, 32)).bind(row, {})
    for i, (p, v) in enumerate(zip(desc["params"], row)):
        spec, what = bundle.arg_spec(p, v), (p["name"], v)
        if bound.signature[p["name"]] == "constexpr":  # Triton folded it: == 1
            assert spec == "1", what
            continue
        assert bundle.arg_type(p, v, "x") == bound.signature[p["name"]], what
        assert spec == ("16" if ["tt.divisibility", 16] in bound.attrs.get((i,), []) else ""), what


def test_annotated_int_is_refused_a_float():
    p = {"name": "n", "annotation": "i64", "specialize": True, "align": True}
    with pytest.raises(TypeError, match=r"kernel k, argument n: a float \(2.5\) cannot be passed as i64"):
        bundle.arg_type(p, 2.5, "kernel k, argument n")


ANNOTATED_TEST = r"""
#include <lazytriton/bundle.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

// One line per check: its specialization, or "error: " and the error's message.
void report(const char* label, const std::function<std::string()>& f) {
  try {
    std::printf("%s: %s\n", label, f().c_str());
  } catch (const lt::Error& e) {
    std::printf("%s: error: %s\n", label, e.what());
  }
}

int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  float* p = reinterpret_cast<float*>(uintptr_t(1) << 20);
  double* q = reinterpret_cast<double*>(uintptr_t(1) << 20);
  lt::BundleKernel k = b.kernel("store_scalars", "STORE_SIG");
  lt::BundleKernel probe = b.kernel("scalar_probe", "PROBE_SIG");
  ROWS
  report("pointer for float", [&] { return k.specialization({p, q, p, 1.0, 1.0, 1.0, 3}); });
  report("float for int", [&] { return k.specialization({p, q, 1.0, 1.0, 1.0, 1.0, 3.0}); });
  report("unannotated type",
         [&] { return b.kernel("store_scalars", "*fp32,*fp64,fp32,bf16,fp32,fp64,i64").signature(); });
  report("int class", [&] { return b.kernel("store_scalars", "*fp32,*fp64,fp16,bf16,fp32,fp64,i32").signature(); });
  lt::BundleKernel s = b.kernel("kernels.annotated:scale_fp16_kernel", "*fp32,*fp32,fp16,i32");
  report("keyed", [&] { return s.specialization({p, p, 3, 100}); });
}
"""


def specialization_check(label: str, kernel: str, args) -> str:
    """A report() line of ANNOTATED_TEST: `kernel`.specialization of the C++ expressions `args`."""
    return f'report("{label}", [&] {{ return {kernel}.specialization({{{", ".join(args)}}}); }});'


@pytest.fixture(scope="module")
def annotated_output(tmp_path_factory, annotated_bundle) -> dict:
    if CMAKE is None:
        pytest.skip("needs cmake (pip install cmake)")
    src = tmp_path_factory.mktemp("annotated-src")
    checks = [specialization_check(f"row{i}", "k", ["p", "q", *map(cpp_arg, r)]) for i, r in enumerate(ANNOTATED_ROWS)]
    checks += [specialization_check(f"overflow{i}", "k", ["p", "q", cpp_arg(h), "1.0", "1.0", "1.0", "3"])
               for i, h in enumerate(FP16_OVERFLOW)]
    checks += [specialization_check(f"probe{i}", "probe", map(cpp_arg, r)) for i, r in enumerate(PROBE_ROWS)]
    calls = "\n  ".join(checks)
    text = ANNOTATED_TEST.replace("STORE_SIG", STORE_SIG).replace("PROBE_SIG", PROBE_SIG).replace("ROWS", calls)
    (src / "api_test.cc").write_text(text)
    (src / "CMakeLists.txt").write_text(API_CMAKE)
    cmake_build(src, src / "build")
    out = run(src / "build" / "api_test", annotated_bundle)
    assert out.returncode == 0, out.stdout + out.stderr
    return dict(line.split(": ", 1) for line in out.stdout.splitlines())


@pytest.mark.parametrize("i", range(len(ANNOTATED_ROWS)))
def test_cpp_annotated_scalars_specialize_as_python_records_them(annotated_output, i):
    # the C++ side picks the variant Python would have recorded for these values
    assert annotated_output[f"row{i}"] == python_signature(annotated.store_scalars, store_args(ANNOTATED_ROWS[i]))


@pytest.mark.parametrize("i", range(len(PROBE_ROWS)))
def test_cpp_specialization_matches_tritons_binder(annotated_output, i):
    # python_signature agrees with Triton's binder on these rows (test_bundle_specialization_matches_tritons_binder)
    assert annotated_output[f"probe{i}"] == python_signature(annotated.scalar_probe, PROBE_ROWS[i])


@pytest.mark.parametrize("i", range(len(FP16_OVERFLOW)))
def test_cpp_fp16_overflow_names_kernel_and_argument(annotated_output, i):
    assert annotated_output[f"overflow{i}"] == (
        f"error: kernel store_scalars: argument h: {FP16_OVERFLOW[i]} does not fit fp16 "
        "(it rounds beyond 65504; Triton's launcher raises OverflowError)")


@pytest.mark.parametrize("label,message", [
    ("pointer for float", "error: kernel store_scalars: argument h: expects a number (fp16), got a device pointer"),
    ("float for int", "error: kernel store_scalars: argument n: expects an integer (i64), got a float"),
    ("unannotated type",
     "error: kernel store_scalars: argument h: annotated fp16 in the kernel, but the signature says fp32"),
    ("int class", "error: kernel store_scalars: argument n: annotated i64 in the kernel, but the signature says i32"),
    ("keyed", "*fp32:16,*fp32:16,fp16,i32"),
])
def test_cpp_annotated_scalar_checks(annotated_output, label, message):
    assert annotated_output[label] == message


def test_a_parameter_named_like_a_launch_option_is_refused_by_name():
    """C++ calls pass constexprs and launch options in one map: a call parameter named num_warps
    is refused, naming it; one the configs set (the autotuned kernel's) is no call parameter."""
    from kernels import differential_kernels as dk
    from lazytriton.model.spec import KernelSpecError

    with pytest.raises(KernelSpecError, match=r"kernel option_params: C\+\+ bundles do not take a parameter named "
                                              r"like a launch option \(num_warps\)"):
        bundle.describe(dk.option_params)
    tuned = bundle.describe(dk.option_params_tuned)
    assert {"num_warps", "num_stages"} <= set(tuned["supplied"]) and [p["name"] for p in tuned["params"]] == [
        "x", "out", "n"]
