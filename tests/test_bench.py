"""The benchmark harness on a machine without a GPU: `lazytriton bench --suite cpu`
runs for real (lowering, cold compiles for sm_90, a stub build) and writes
results.json, report.md and a plot."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lazytriton.bench.timing import interleaved, summary


def test_interleaved_keeps_every_sample_and_summary_reads_them():
    calls = []
    samples = interleaved({"a": lambda b: calls.append("a") or 2e-6 * b, "b": lambda b: calls.append("b") or None},
                          lambda: None, rounds=5, batch=10)
    assert calls == ["a", "b"] * 5  # rounds interleave the paths
    assert samples["a"] == pytest.approx([2.0] * 5)
    assert len(samples["b"]) == 5 and all(s >= 0 for s in samples["b"])
    s = summary([5, 1, 4, 2, 3])
    assert (s["median"], s["p10"], s["p90"], s["n"]) == (3, 1, 5, 5)


def test_cpu_suite_writes_results_report_and_plot(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--suite", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, cwd=str(tmp_path),
                       env={**os.environ, "TRITON_DEFAULT_FP_FUSION": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "section 1/1: cpu" in r.stderr and "compiling each demo config" in r.stderr  # progress is shown
    res = json.loads((out / "results.json").read_text())
    rows = res["sections"]["cpu"]["rows"]
    names = [row["system"] for row in rows]
    assert names[0].startswith("lazytriton.jax: jit(...).lower()")
    assert sum(n.startswith("compile config") for n in names) == 8 and names[-1].startswith("launch stub build")
    assert all(row["samples"] and all(math.isfinite(v) and v > 0 for v in row["samples"]) for row in rows)
    assert res["environment"]["triton"] and res["suite"] == "cpu"
    md = (out / "report.md").read_text()
    assert "| compile config 7" in md and "launch stub build" in md
    pytest.importorskip("matplotlib")
    assert (out / "cpu.png").stat().st_size > 1000 and "![" in md


def test_gpu_suite_without_a_gpu_says_so(tmp_path):
    import lazytriton

    if lazytriton.gpu_available()[0]:
        pytest.skip("a GPU is present")
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--suite", "quick", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path))  # the installed package
    assert r.returncode == 2 and "no GPU here" in r.stderr and "--suite cpu" in r.stderr
