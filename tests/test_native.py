"""Builds made at run time (lazytriton.runtime.native) when their process ends first:
an ordinary build (a launch stub) is stopped with everything its compiler
started, leaving no compiler running and no temp file; a build that may outlive
its process (the torch tensor reader, whose g++ run against torch's headers
takes longer than a short script) finishes in its builder process and is
published for the next process."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# A module that takes a few seconds of g++ (pybind11's headers), so that its process ends mid-build.
SLOW = """#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
PYBIND11_MODULE(NAME, m) { m.attr("x") = 7; }
"""


def start_build_then_exit(cache: Path, name: str, outlive: bool) -> subprocess.CompletedProcess:
    source = cache.parent / f"{name}.cc.in"
    source.write_text(SLOW.replace("NAME", name))
    code = textwrap.dedent(f"""
        import threading, time
        from lazytriton.runtime import native
        src = open({str(source)!r}).read()
        t = threading.Thread(target=lambda: native.load_module("{name}", lambda: src, "a slow module",
                                                               background=True, outlive={outlive}), daemon=True)
        t.start()
        time.sleep(1.0)  # the compiler is running
    """)
    env = dict(os.environ, LAZYTRITON_CACHE_DIR=str(cache))
    # cwd outside the checkout: the process imports the installed package.
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=str(cache.parent))


def processes_mentioning(text: str) -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                out.append(cmd[:200])
    return out


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_a_build_is_stopped_with_its_process(tmp_path):
    cache = tmp_path / "cache"
    r = start_build_then_exit(cache, "lt_slow_stopped", outlive=False)
    assert r.returncode == 0, r.stderr[-2000:]
    time.sleep(0.5)
    assert processes_mentioning(str(cache)) == []  # the compiler's children (cc1plus, as) too
    stubs = list(cache.glob("stubs/*/*"))
    assert not [f for f in stubs if f.name.endswith(".tmp") or f.suffix == ".so"], stubs


@pytest.mark.heavy
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_a_build_that_may_outlive_its_process_is_published(tmp_path, monkeypatch):
    from lazytriton.runtime import native

    cache = tmp_path / "cache"
    r = start_build_then_exit(cache, "lt_slow_outliving", outlive=True)
    assert r.returncode == 0, r.stderr[-2000:]
    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(cache))
    deadline = time.monotonic() + 180
    while processes_mentioning(str(cache)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert native.built_and_intact("lt_slow_outliving")  # published by the builder, checksum and all
    module = native.load_module("lt_slow_outliving", lambda: pytest.fail("built again"), "a slow module")
    assert module.x == 7
