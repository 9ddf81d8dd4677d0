"""The Triton version matrix (tests/triton_versions/check.py): lazytriton's
binding, stub specialization, parameter packing and launch metadata against
Triton's own binder and launcher, on the CPU.

- on the Triton installed here, in this process;
- on Triton 3.5, 3.6, 3.7, 3.8 and the newest on the package index, each in its venv
  made by tests/triton_versions/setup_venvs.sh (skipped when a venv is absent;
  one built from other lazytriton sources than this checkout's fails, saying
  to run the script again). $LAZYTRITON_TRITON_VENVS: where the venvs are.
"""
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
MATRIX = HERE / "triton_versions"
REPO = HERE.parent
VENVS = Path(os.environ.get("LAZYTRITON_TRITON_VENVS", "~/.cache/lazytriton-triton-venvs")).expanduser()
# The Triton versions with venvs of their own (setup_venvs.sh; CI makes all but "newest"),
# read by every test that runs in them.
VERSIONS = ["3.5", "3.6", "3.7", "3.8", "newest"]
CASES = {"scalars_and_pointers", "annotated", "constexpr_kinds", "autotune_inner_heuristics",
         "autotune_outer_heuristics", "device_tma_descriptor", "num_ctas_2_and_pdl", "warp_specialized_matmul",
         "gluon_vec_add", "gluon_autotuned"}


def _module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def check_report(report: dict, version: str) -> None:
    assert not report["failures"], f"triton {report['triton']}:\n" + "\n".join(report["failures"])
    assert set(report["cases"]) == CASES
    for name, info in report["cases"].items():
        # Every case runs on every Triton the matrix covers (3.5 on): none may be unsupported.
        assert info["unsupported"] is None, f"triton {version}: {name}: {info['unsupported']}"
        assert info["calls"] and info["configs"] >= info["calls"] and info["compiled"], (name, info)
    assert report["cases"]["scalars_and_pointers"]["specializations"] >= 12  # the calls really differ


@pytest.mark.heavy
def test_matrix_on_the_installed_triton(cache_dir, tmp_path, monkeypatch):
    import triton

    # Triton's reference compiles in a cache of their own: Triton's key leaves out where Triton is
    # installed, which its line info names, so an entry another installation wrote is another cubin.
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    check = _module("lt_triton_matrix", MATRIX / "check.py")
    report = check.run()
    assert report["triton"] == triton.__version__
    check_report(report, triton.__version__)


@pytest.mark.parametrize("version", VERSIONS)
def test_matrix_on_triton_version(version, tmp_path):
    venv = VENVS / f"triton-{version}"
    py = venv / "bin" / "python"
    if not py.exists():
        pytest.skip(f"no venv for triton {version} at {venv}: run tests/triton_versions/setup_venvs.sh")
    stamp = _module("lt_triton_stamp", MATRIX / "stamp.py")
    made_from = (venv / "lazytriton-sources.sha256").read_text().strip() if (venv / "lazytriton-sources.sha256").exists() else None
    if made_from != stamp.source_digest(REPO):
        pytest.fail(f"{venv} holds a lazytriton built from other sources than this checkout's: run "
                    f"tests/triton_versions/setup_venvs.sh {version}")
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(tmp_path / "ltcache"), TRITON_CACHE_DIR=str(tmp_path / "triton"))
    env.pop("PYTHONPATH", None)
    p = subprocess.run([str(py), str(MATRIX / "check.py"), "--json"], env=env, cwd=str(tmp_path),
                       capture_output=True, text=True, timeout=1200)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no report (exit {p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    report = json.loads(lines[-1])
    if version != "newest":
        assert report["triton"].startswith(version + "."), report["triton"]
    assert Path(report["lazytriton"]).resolve().is_relative_to(venv.resolve()), report["lazytriton"]
    check_report(report, report["triton"])
    assert p.returncode == 0, p.stderr[-3000:]


def test_matrix_follows_tritons_knobs(cache_dir, tmp_path, monkeypatch):
    """Settings JITFunction.run reads from Triton's knobs (TRITON_DEBUG; from 3.6 on
    TRITON_INSTRUMENTATION_MODE, which also changes the debug and overflow options)
    bind as Triton binds them, and the compile workers, whose server started before
    the settings changed, compile under them (TRITON_DISABLE_LINE_INFO is read by
    Triton's backend itself and changes the cubin): Triton's own cubin, in this
    test's Triton cache."""
    check = _module("lt_triton_matrix", MATRIX / "check.py")
    from lazytriton.compile import pool as compile_pool

    compile_pool.start()  # the server runs before the settings change
    pool = compile_pool.get_pool()
    assert pool.wait_ready()
    deadline = time.perf_counter() + 120
    while "hashed_at" not in pool.timeline:  # jobs forked before it fill a private Triton cache
        assert time.perf_counter() < deadline, pool.timeline
        time.sleep(0.01)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("TRITON_DEBUG", "1")
    import triton

    if hasattr(triton.knobs.compilation, "instrumentation_mode"):  # read from the environment at import
        monkeypatch.setattr(triton.knobs.compilation, "instrumentation_mode", "consan")
    monkeypatch.setenv("TRITON_DISABLE_LINE_INFO", "1")
    report = check.run(["constexpr_kinds"])
    assert not report["failures"], "\n".join(report["failures"])
    assert report["cases"]["constexpr_kinds"]["compiled"] == 1
    assert any((tmp_path / "triton").rglob("*.cubin"))  # the workers wrote to this test's cache


def test_every_metadata_field_is_read_or_said_irrelevant(cache_dir):
    """The matrix compares every field of Triton's metadata: one that lazytriton neither reads
    nor lists as irrelevant to launching, or reads differently, fails naming it."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from lazytriton import _core
    from lazytriton.cache.entries import CompiledBinary

    @triton.jit
    def copy(x, n, B: tl.constexpr):
        i = tl.program_id(0) * B + tl.arange(0, B)
        tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)

    check = _module("lt_triton_matrix", MATRIX / "check.py")
    ck = triton.compile(ASTSource(copy, {"x": "*fp32", "n": "i32", "B": "constexpr"}, {(2,): 64}),
                        target=GPUTarget("cuda", 90, 32))
    theirs = ck.metadata._asdict()
    ours = _core.Kernel(ck.asm["cubin"], CompiledBinary.from_triton(ck).metadata).metadata
    assert check.metadata_differences(theirs, ours) == []
    [why] = check.metadata_differences({**theirs, "launch_new_thing": 1}, ours)
    assert why.startswith("launch_new_thing=1: a metadata field lazytriton neither reads"), why
    [why] = check.metadata_differences(theirs, {**ours, "shared": theirs["shared"] + 16})
    assert why.startswith("shared: Triton has"), why
    assert set(check.LAUNCH_FIELDS).isdisjoint(check.NOT_FOR_LAUNCH)
