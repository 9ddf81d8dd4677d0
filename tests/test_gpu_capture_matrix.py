"""The command-buffer matrix: every autotuned-kernel case of
capture_matrix_worker.py, in every configuration that changes how XLA runs
it, plain and under compute-sanitizer's memcheck.

Rows: command buffers on (every custom call captured) / off; XLA's BFC
allocator / the platform allocator (one buffer per cudaMalloc, so memcheck
sees exact bounds); LAZYTRITON_CAPTURE_FALLBACK unset / first_config;
garbage left in freed device memory before the first call / not. Inside each
row, every case runs with stable and with changing buffer addresses.

By default a subset that fits a short GPU session runs; LAZYTRITON_FULL_MATRIX=1
runs every row (the table is printed either way: pytest -s shows it).
"""
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.heavy]
pytest.importorskip("jax")
WORKER = Path(__file__).resolve().parent / "capture_matrix_worker.py"
# Under memcheck (tens of times slower) every case with an index map, an alias,
# zeroing or scratch; LAZYTRITON_FULL_MATRIX=1 runs the chain there as well.
MEMCHECK_CASES = ("permute,scatter,inplace,unshared_alias,zeroed,two_outputs,scratch"
                  + (",inplace_donated,chain" if os.environ.get("LAZYTRITON_FULL_MATRIX") == "1" else ""))
CMDBUF = {"on": "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1",
          "off": "--xla_gpu_enable_command_buffer="}


def _rows():
    full = os.environ.get("LAZYTRITON_FULL_MATRIX") == "1"
    rows = []
    for cmd, alloc, fallback, garbage, tool in itertools.product(("on", "off"), ("bfc", "platform"),
                                                                 ("unset", "first_config"), (True, False),
                                                                 ("plain", "memcheck")):
        fast = (garbage and fallback == "unset" and tool == "plain") or (
            garbage and fallback == "first_config" and tool == "memcheck" and cmd == "on")
        if full or fast:
            rows.append(pytest.param(cmd, alloc, fallback, garbage, tool,
                                     marks=[pytest.mark.slow] if tool == "memcheck" else [],  # minutes each
                                     id=f"cmdbuf_{cmd}-{alloc}-fallback_{fallback}-{'garbage' if garbage else 'clean'}-{tool}"))
    return rows


@pytest.mark.parametrize("cmdbuf, allocator, fallback, garbage, tool", _rows())
def test_matrix_row(tmp_path, cmdbuf, allocator, fallback, garbage, tool):
    env = {**os.environ, "XLA_FLAGS": CMDBUF[cmdbuf], "LAZYTRITON_CACHE_DIR": str(tmp_path / "ltcache"),
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "PYTHONUNBUFFERED": "1"}
    env.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
    env.pop("LAZYTRITON_CAPTURE_FALLBACK", None)
    if allocator == "platform":
        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    if fallback != "unset":
        env["LAZYTRITON_CAPTURE_FALLBACK"] = fallback
    # Stable and changing addresses share call sites: the first mode tunes them.
    modes = "stable,changing" if allocator == "bfc" else "changing,stable"
    cmd = [sys.executable, str(WORKER), "--modes", modes] + (["--garbage"] if garbage else [])
    if tool == "memcheck":
        cmd += ["--cases", MEMCHECK_CASES]
        if shutil.which("compute-sanitizer") is None:
            pytest.skip("compute-sanitizer not installed")
        cmd = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99", "--print-limit", "20"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200, cwd=str(tmp_path))
    out = r.stdout + r.stderr
    results = [json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    table = "\n".join(f"  {x['case']:15s} {x['mode']:9s} {'ok' if x['ok'] else 'FAIL'}"
                      f"{' (' + x['skipped'] + ')' if x.get('skipped') else ''}"
                      f"  executions={x['executions']} trial launches per execution={x['bench_launches']}"
                      f"{'  ' + x.get('error', '') if not x['ok'] else ''}" for x in results)
    report = f"\n[{cmdbuf=} {allocator=} {fallback=} {garbage=} {tool=}] rc={r.returncode}\n{table}"
    print(report)
    if os.environ.get("LAZYTRITON_MATRIX_REPORT"):  # collected across rows (and xdist workers)
        with open(os.environ["LAZYTRITON_MATRIX_REPORT"], "a") as fh:
            sanitizer = [ln for ln in out.splitlines() if ln.startswith("=========")]
            fh.write(report + ("\n  memcheck:\n    " + "\n    ".join(sanitizer[:40]) if tool == "memcheck" else "")
                     + ("\n  error:\n" + out[-3000:] if r.returncode else "") + "\n")
    n_cases = len(MEMCHECK_CASES.split(",")) if tool == "memcheck" else 9
    assert results and len(results) == 2 * n_cases, out[-6000:]
    failed = [x for x in results if not x["ok"]]
    assert not failed, "\n".join(f"{x['case']}/{x['mode']}: {x.get('error')}\n{x.get('trace', '')}" for x in failed)
    assert r.returncode == 0, out[-6000:]
    if tool == "memcheck":
        assert "ERROR SUMMARY: 0 errors" in out, out[-6000:]
