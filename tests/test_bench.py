"""The benchmark harness. Without a GPU: the `cpu` suite end to end (real
lowering, cold compiles for sm_90, a stub build, through the runner's
subprocesses), suite composition and --dry-run, merging processes, failures
and timeouts of processes, the time budget, the environment and caches each
process gets, the report and every plot from a synthetic results.json, the
first-call timeline phases, the C++ program's build, the FFI floor handlers'
build and the CUDA lowering of every JAX path the GPU suites time, the JAX
chain process and the JAX throughput section on JAX's CPU backend, and the
reference checks those paths use. With a GPU: the quick suite end to end,
every planned row measured and correct, each process within 2x its estimate."""
import json
import math
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lazytriton.bench import cli, cold, cpp, plan, redis_server, report, torch_group
from lazytriton.bench.timing import interleaved, summary

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "TRITON_DEFAULT_FP_FUSION": "1"}


def test_interleaved_keeps_every_sample_and_summary_reads_them():
    calls = []
    samples = interleaved({"a": lambda b: calls.append("a") or 2e-6 * b, "b": lambda b: calls.append("b") or None},
                          lambda: None, rounds=5, batch=10)
    assert calls == ["a", "b"] * 5  # rounds interleave the paths
    assert samples["a"] == pytest.approx([2.0] * 5)
    assert len(samples["b"]) == 5 and all(s >= 0 for s in samples["b"])
    s = summary([5, 1, 4, 2, 3])
    assert (s["median"], s["p10"], s["p90"], s["n"]) == (3, 1, 5, 5)


@pytest.mark.heavy
def test_cpu_suite_writes_results_report_and_plot(tmp_path):
    pytest.importorskip("jax")
    out = tmp_path / "bench"
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--suite", "cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=900, cwd=str(tmp_path), env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "[1/1] cpu:" in r.stderr and "compile config 7 (8/8)" in r.stderr  # progress: what runs, what is left
    assert "left after it: 0 processes" in r.stderr
    res = json.loads((out / "results.json").read_text())
    rows = res["sections"]["cpu"]["rows"]
    names = [row["system"] for row in rows]
    # What ran is what --dry-run lists.
    groups, _ = plan.build("cpu", gpus=0)
    assert names == groups[0].rows["cpu"]
    assert names[0].startswith("lazytriton.jax: jit(...).lower()")
    assert sum(n.startswith("compile config") for n in names) == 8 and names[-1].startswith("launch stub build")
    assert all(row["samples"] and all(math.isfinite(v) and v > 0 for v in row["samples"]) for row in rows)
    assert all(len(row["process_samples"]) == 1 for row in rows)
    assert res["environment"]["triton"] and res["suite"] == "cpu" and res["runs"][0]["ok"]
    assert not (out / ".work").exists()  # the run's caches are removed
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


def test_cli_refuses_bad_arguments(tmp_path):
    assert cli.main(["--suite", "full", "--only", "launch,nonsense", "--dry-run", "--out", str(tmp_path)]) == 2
    assert cli.main(["--suite", "cpu", "--processes", "0", "--out", str(tmp_path)]) == 2
    with pytest.raises(SystemExit):
        cli.main(["--suite", "huge"])
    with pytest.raises(ValueError, match="unknown suite"):
        plan.build("huge", gpus=1)


# -- suite composition -----------------------------------------------------------------------


def test_cli_out_errors_are_one_line_not_a_traceback(tmp_path, capsys):
    assert cli.main(["--report-only", "--out", str(tmp_path / "none")]) == 2
    assert f"--report-only: no {tmp_path / 'none' / 'results.json'}" in capsys.readouterr().err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text("{cut short")
    assert cli.main(["--report-only", "--out", str(tmp_path / "bad")]) == 1
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "afile").write_text("")
    assert cli.main(["--suite", "cpu", "--out", str(tmp_path / "afile")]) == 2
    assert "--out " + str(tmp_path / "afile") + " is a file" in capsys.readouterr().err
    assert cli.main(["--suite", "cpu", "--out", str(tmp_path / "afile" / "sub")]) == 2  # under a file: not made
    assert "cannot make --out" in capsys.readouterr().err


def _all(_module):
    return True


def test_suites_compose_every_system_and_fit_their_budgets():
    full, notes = plan.build("full", gpus=1, importable=_all)
    names = [g.name for g in full]
    assert names == ["torch", "throughput", "jax-cb-on", "jax-cb-off", "cold-triton", "cold-lazy", "warm-lazy",
                     "cold-lazy-gap", "cold-jax", "warm-jax", "cold-jax-runtime-handler", "cold-jax-triton", "cpu"]
    # The row warm from Redis: where a redis-server is installed (CI installs it), when its section is asked
    # for (--only first_call), after the cold row whose winners it finds.
    redis = ["warm-redis", "warm-lazy-gap", "warm-redis-gap"] if redis_server.available() else []
    quick_first = [g.name for g in plan.build("quick", gpus=1, importable=_all, only={"first_call"})[0]
                   if "first_call" in g.rows]
    assert quick_first == ["cold-triton", "cold-lazy", "warm-lazy", *redis, "cold-jax", "cold-jax-triton"]
    assert any("with --only first_call" in n for n in notes) == bool(redis)
    rows = {}
    for g in full:
        for sec, rs in g.rows.items():
            rows.setdefault(sec, []).extend(rs)
    for sec, rs in rows.items():
        assert len(rs) == len(set(rs)), f"section {sec}: a row name twice"
    launch, chain = rows["launch"], rows["chain"]
    assert "raw cuLaunchKernel loop (C++)" in launch and "CUDA graph replay, per kernel" in launch
    assert "Triton's launcher kernel[grid](...)" in launch and "lazytriton k[grid](...), CuPy" in launch
    assert {torch_group.TABLE_DRIVEN + ", torch", torch_group.TABLE_DRIVEN + ", CuPy"} <= set(launch)
    assert {"C++ program: BundleKernel::launch(Dim3)", "C++ program: typed stub launch_bench_add(k, ...)",
            "C++ program: raw cuLaunchKernel loop"} <= set(launch)
    for want in ("lazytriton.jax, command buffers on", "lazytriton.jax, command buffers on, donated input",
                 "lazytriton.jax, command buffers off", "jax-triton, command buffers on",
                 "floor: bare XLA FFI handler, no launch, command buffers off",
                 "floor: CUDA graph replay of the same cubin", "floor: raw cuLaunchKernel loop, same cubin"):
        assert want in chain
    tp = rows["throughput"]
    assert sum(r.startswith("matmul ") and r.endswith(": lazytriton") for r in tp) == 3  # the matmul at 3 shapes
    for w in ("vector add", "softmax", "layer norm", "permute rows", "in-place scale"):
        assert any(r.startswith(w) for r in tp) and any(r.startswith(w) for r in rows["jax_throughput"])
    jtp = rows["jax_throughput"]
    assert any("XLA's op" in r for r in jtp) and any("jax-triton" in r for r in jtp)
    assert any(r.startswith("matmul") for r in rows["tuning"]) and "vector add 64M fp32" not in rows["tuning"]
    assert len(rows["first_call"]) == 8 and any("warm" in r for r in rows["first_call"])
    # Triton's TMA tutorials: lazytriton beside Triton's own launch of the same config, at both sizes.
    for sec in ("throughput", "small"):
        assert sum("TMA persistent matmul" in r for r in rows[sec]) == 4 - (sec == "throughput")
        assert sum("flash attention fwd" in r and "same config" in r for r in rows[sec]) == 1
    assert not any("TMA" in r or "attention" in r for r in rows["tuning"])
    assert any("distributed" in n and "2 GPUs" in n for n in notes)
    # Budgets: the full suite in 3 processes (jax-triton too) fits the default budget with room to spare,
    # and the budget leaves a 10-minute device command time for the report; quick is under 3 minutes.
    assert plan.estimate_s(full, 3) <= cli.DEFAULT_BUDGET_S - 30
    assert cli.DEFAULT_BUDGET_S + cli.BUDGET_GRACE_S + plan.REPORT_S <= 9 * 60
    quick, _ = plan.build("quick", gpus=1, importable=_all)
    assert plan.estimate_s(quick, cli.DEFAULT_PROCESSES["quick"]) <= 2.7 * 60
    assert {"cold-jax-runtime-handler", "warm-jax"}.isdisjoint(g.name for g in quick)
    assert "small" not in next(g for g in quick if g.name == "torch").rows
    two, _ = plan.build("full", gpus=2, importable=_all)
    assert "distributed" in [g.name for g in two]
    one, _ = plan.build("full", gpus=1, importable=_all, only={"distributed"})
    assert "distributed" in [g.name for g in one]  # asked for: its ranks share the one GPU
    # The heavy-package rows (fresh processes importing torch and jax): only when asked for.
    assert "field" not in [g.name for g in two] and "field" not in [g.name for g in quick]
    field_only, _ = plan.build("quick", gpus=1, importable=_all, only={"field"})
    assert [g.sections for g in field_only if g.name == "field"] == [["field", "field_program"]]


def test_schedule_is_round_robin_and_cold_rows_precede_their_warm_rows():
    groups, _ = plan.build("full", gpus=1, importable=_all)
    order = plan.schedule(groups, 3)
    reps = [rep for _, rep in order]
    assert reps == sorted(reps)  # repetition by repetition: drift hits every group alike
    assert [g.name for g, rep in order if rep == 2][:4] == ["torch", "throughput", "jax-cb-on", "jax-cb-off"]
    once = [g.name for g, _ in order if g.name in ("cpu", "cold-jax-runtime-handler")]
    assert once == ["cold-jax-runtime-handler", "cpu"]  # once, whatever --processes says
    for rep in range(3):
        names = [g.name for g, r in order if r == rep]
        assert names.index("cold-lazy") < names.index("warm-lazy") and names.index("cold-jax") < names.index("warm-jax")
    warm = next(g for g in groups if g.name == "warm-lazy")
    assert warm.fresh_cache == "cold-lazy" and warm.script == cold.LAZY
    # The same cold script with a gap between wrapping and calling: its own fresh caches, once.
    gap = next(g for g in groups if g.name == "cold-lazy-gap")
    assert gap.script == cold.LAZY and gap.fresh_cache == "cold-lazy-gap" and gap.once
    assert float(gap.env["LAZYTRITON_BENCH_WRAP_GAP_S"]) > 1


def test_missing_modules_skip_their_groups_with_a_note():
    groups, notes = plan.build("full", gpus=1, importable=lambda m: m in ("triton", "jax"))
    assert {g.name for g in groups} == {"jax-cb-on", "jax-cb-off", "cold-jax", "warm-jax", "cold-jax-runtime-handler",
                                        "cpu"}
    assert any("torch not importable" in n for n in notes) and any("jax_triton not importable" in n for n in notes)


def test_dry_run_lists_processes_rows_and_estimate(tmp_path):
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--suite", "full", "--dry-run", "--out",
                        str(tmp_path / "never")], capture_output=True, text=True, timeout=120, cwd=str(tmp_path),
                       env=ENV)
    assert r.returncode == 0, r.stderr
    assert "lazytriton bench --suite full:" in r.stdout and "min by estimate" in r.stdout
    assert "group cpu:" in r.stdout and "    - launch stub build (generated C, g++)" in r.stdout
    assert not (tmp_path / "never").exists()  # nothing ran
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--suite", "full", "--dry-run", "--only", "cpu"],
                       capture_output=True, text=True, timeout=120, cwd=str(tmp_path), env=ENV)
    assert r.returncode == 0 and "group cpu:" in r.stdout and "group jax-cb-on" not in r.stdout


@pytest.mark.parametrize("script,section", [("launch_overhead.py", "launch"), ("cpp_launch_overhead.py", "launch"),
                                            ("jax_chain.py", "chain"), ("cold_warm_start.py", "first_call"),
                                            ("distributed_first_step.py", "distributed"),
                                            ("tma_steady_state.py", "throughput"), ("cold_field.py", "field")])
def test_benchmark_scripts_are_entry_points_to_the_harness(script, section, tmp_path):
    src = (ROOT / "benchmarks" / script).read_text()
    assert "script_main" in src and "perf_counter" not in src and "def " not in src  # no timing loop of their own
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), "--dry-run"], capture_output=True,
                       text=True, timeout=120, cwd=str(tmp_path), env=ENV)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "lazytriton bench --suite full:" in r.stdout
    planned = {s for g in plan.build("full", gpus=2, importable=_all, only={section})[0] for s in g.sections}
    assert section in planned


def test_workloads_option_keeps_the_named_workloads_in_every_section(monkeypatch):
    """--workloads (tma_steady_state.py: the TMA tutorials) reaches the plan and
    every process through LAZYTRITON_BENCH_WORKLOADS."""
    assert 'workloads="TMA,attention"' in (ROOT / "benchmarks" / "tma_steady_state.py").read_text()
    monkeypatch.setenv("LAZYTRITON_BENCH_WORKLOADS", "TMA,attention")
    rows = {}
    for g in plan.build("full", gpus=1, importable=_all)[0]:
        for sec, rs in g.rows.items():
            rows.setdefault(sec, []).extend(rs)
    for sec in ("small", "throughput"):
        assert rows[sec] and all("TMA" in x or "attention" in x for x in rows[sec]), rows[sec]
    assert rows["tuning"] == [] and rows["jax_throughput"] == []
    assert len(rows["launch"]) > 3  # sections without workloads are not filtered


def test_tuning_kernels_name_the_harness_kernel():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import tuning_kernels

        from lazytriton.bench import kernels
        assert tuning_kernels.softmax is kernels.softmax_rows and len(tuning_kernels.SOFTMAX_CONFIGS) == 9
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


# -- the runner's processes ---------------------------------------------------------------------


def test_a_failing_or_hanging_process_becomes_a_note_not_a_lost_run(tmp_path):
    boom = plan.Group("boom", "a process that fails", {"launch": ["x"]},
                      script="import sys; print('about to fail', flush=True); sys.exit(3)")
    sections, error = cli._process(boom, 0, "quick", tmp_path, timeout=60)
    assert sections is None and "exit 3" in error and "about to fail" in error
    hang = plan.Group("hang", "a process that hangs", {"chain": ["y"]}, script="import time; time.sleep(600)")
    sections, error = cli._process(hang, 0, "quick", tmp_path, timeout=3)
    assert sections is None and "timed out after 3 s" in error
    merged = cli.merge([{"group": "boom", "rep": 0, "error": error, "planned": ["launch", "chain"]}])
    assert list(merged) == ["launch", "chain"] and "FAILED (timed out" in merged["chain"]["notes"][0]


def test_a_cold_script_process_yields_its_timeline_row(tmp_path):
    raw = {"first_call_s": 1.5, "imports_s": 2.0, "steady_call_s": 0.001, "max_err": 0.0,
           "stats": {"compiles": 8, "tunes": 1, "record_hits": 0, "resolves": 1},
           "stub_events": [[0.01, "building launch stub lt_stub_x for (a, b)"], [0.75, "built launch stub x in 0.74s"]],
           "resolutions": [{"kernel": "demo_matmul", "candidates": 8, "compiled_s": 0.9, "tuned_s": 1.3, "at": 1.35}]}
    g = plan.Group("cold-lazy", "first call", {"first_call": ["lazytriton, cold"]},
                   script=cold.PRELUDE + f"done({raw!r})\n", fresh_cache="cold-lazy")
    sections, error = cli._process(g, 1, "full", tmp_path, timeout=60)
    assert error is None
    (row,) = sections["first_call"]["rows"]
    assert row["system"] == "lazytriton, cold" and row["samples"] == [1.5]
    lanes = {p[0]: p[1:] for p in row["phases"]}
    assert lanes["bind + cache lookup"] == pytest.approx([0.0, 0.05])
    assert lanes["compile candidates"] == pytest.approx([0.05, 0.95])
    assert lanes["compile + tune (overlapped)"] == pytest.approx([0.05, 1.35])
    assert lanes["launch stub build (background)"] == pytest.approx([0.01, 0.75])
    assert lanes["first launch"] == pytest.approx([1.35, 1.5])
    assert row["split"]["imports_s"] == 2.0 and row["stats"]["compiles"] == 8


# Checks a first-call process's environment as the runner sets it, then leaves a marker in its
# lazytriton cache: a cold process must find none (fresh caches per repetition), a warm one the cold
# one's (shared). FAIL_REP makes the cold process of that repetition fail.
_ENV_CHECK = cold.PRELUDE + r"""
from pathlib import Path
lt, tr = Path(os.environ["LAZYTRITON_CACHE_DIR"]), Path(os.environ["TRITON_CACHE_DIR"])
warm = os.environ["GROUP"].startswith("warm")
problems = [what for what, bad in [
    ("XLA_FLAGS inherited", "XLA_FLAGS" in os.environ),
    ("preallocation", os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE") != "false"),
    ("fp fusion", os.environ.get("TRITON_DEFAULT_FP_FUSION") != "1"),
    ("JAX compilation cache", os.environ.get("JAX_ENABLE_COMPILATION_CACHE") != "false"),
    ("caches not side by side", lt.parent != tr.parent or lt.parent.name != "cold-lazy"
     or not lt.parent.parent.name.startswith("rep")),
    ("cold row on a used cache" if not warm else "warm row on a fresh cache", (lt / "marker").exists() != warm)]
    if bad]
if problems:
    sys.exit("environment: " + ", ".join(problems))
if not warm and lt.parent.parent.name == "rep" + os.environ.get("FAIL_REP", "-"):
    sys.exit("failing as asked")
lt.mkdir(parents=True, exist_ok=True)
(lt / "marker").write_text("cold")
done({"first_call_s": 0.5 if warm else 1.5, "imports_s": 0.1, "max_err": 0.0, "ref_max": 1.0})
"""


def test_budget_and_warm_rows_decide_what_runs_and_the_report_says_so(tmp_path, monkeypatch):
    """Real processes through the runner: the environment each sees, fresh caches per repetition for a
    cold row and its cold row's for a warm one, a warm row not run when its cold row failed, a process
    not started when its estimate would overrun --budget, and the report listing each."""
    import argparse

    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=")  # as pytest's conftest sets it
    monkeypatch.setenv("FAIL_REP", "1")
    monkeypatch.delenv("TRITON_DEFAULT_FP_FUSION", raising=False)  # the runner sets it
    groups = [plan.Group("cold-lazy", "first call: cold", {"first_call": ["lazytriton, cold"]}, est_s=(1, 1),
                         script=_ENV_CHECK, env={"GROUP": "cold"}, fresh_cache="cold-lazy"),
              plan.Group("warm-lazy", "first call: warm", {"first_call": ["lazytriton, warm"]}, est_s=(1, 1),
                         script=_ENV_CHECK, env={"GROUP": "warm"}, fresh_cache="cold-lazy"),
              plan.Group("cold-triton", "too long for the budget", {"first_call": ["Triton"]}, est_s=(1000, 1000),
                         script="import sys; sys.exit('must not run')")]
    out = tmp_path / "out"
    args = argparse.Namespace(budget=120.0, timeout=None, keep_work=False)
    rc = cli._run_suite("quick", groups, ["something: skipped"], 2, out, args)
    assert rc == 1  # the cold process that failed as asked
    res = json.loads((out / "results.json").read_text())
    runs = {(r["group"], r["rep"]): r for r in res["runs"]}
    assert runs[("cold-lazy", 0)]["ok"] and runs[("warm-lazy", 0)]["ok"], runs
    assert not runs[("cold-lazy", 1)]["ok"] and "failing as asked" in runs[("cold-lazy", 1)]["error"]
    assert "needs the caches of cold-lazy, process 2" in runs[("warm-lazy", 1)]["not_run"]
    assert all("time budget (120 s)" in runs[("cold-triton", rep)]["not_run"] for rep in (0, 1))
    rows = {r["system"]: r for r in res["sections"]["first_call"]["rows"]}
    assert rows["lazytriton, warm (new process, persisted winner)"]["samples"] == [0.5]
    assert rows["lazytriton, cold"]["samples"] == [1.5] and rows["lazytriton, cold"]["correct"] is True
    md = (out / "report.md").read_text()
    assert "**Processes not run:**" in md and "cold-triton (process 1): not run: the time budget" in md
    assert "warm-lazy (process 2): not run: it needs the caches" in md and "**Failed processes:**" in md
    assert res["environment"]["XLA_FLAGS (not passed on)"] == "--xla_gpu_enable_command_buffer="
    # A hung process costs a few times its estimate, the cpu suite's (on CI machines) 300 s.
    assert cli.default_timeout("full", 40) == 160 and cli.default_timeout("full", 5) == 90
    assert cli.default_timeout("cpu", 25) == 300 and cli.default_timeout("full", 500) == 300


# The row warm from Redis: a fresh local cache, LAZYTRITON_REMOTE_CACHE naming the run's server, which
# answers and holds what `lazytriton cache push` published from the cold row's cache (here: nothing,
# the marker script tunes nothing) and not what was there before the seed.
_REDIS_CHECK = cold.PRELUDE + r"""
import redis
from pathlib import Path
lt = Path(os.environ["LAZYTRITON_CACHE_DIR"])
url = os.environ.get("LAZYTRITON_REMOTE_CACHE", "")
if lt.parent.name != "warm-redis" or (lt / "marker").exists() or not url.startswith("redis://127.0.0.1:"):
    sys.exit(f"environment: {lt} {url!r}")
r = redis.Redis.from_url(url)
stale = "lazytriton:v1:meas:" + "0" * 64  # what an earlier repetition's process left
if r.get(stale) is not None:
    sys.exit("the server was not emptied before the seed")
r.set(stale, b"1")
done({"first_call_s": 0.6, "imports_s": 0.1, "max_err": 0.0, "ref_max": 1.0})
"""


@pytest.mark.skipif(redis_server.available() is None, reason="redis-server is not installed (apt-get install "
                    "redis-server; .ci/run installs it)")
def test_the_row_warm_from_redis_gets_a_seeded_server_and_an_empty_cache(tmp_path, monkeypatch):
    import argparse

    pytest.importorskip("redis")
    monkeypatch.setenv("LAZYTRITON_REMOTE_CACHE", "redis://fleet.invalid:6379/0")  # never passed on
    groups = [plan.Group("cold-lazy", "first call: cold", {"first_call": ["lazytriton, cold"]}, est_s=(1, 1),
                         script=_ENV_CHECK, env={"GROUP": "cold"}, fresh_cache="cold-lazy"),
              plan.Group("warm-redis", "first call: warm from Redis", {"first_call": ["lazytriton, from Redis"]},
                         est_s=(1, 1), script=_REDIS_CHECK, fresh_cache="warm-redis", seeded_from="cold-lazy")]
    out = tmp_path / "out"
    rc = cli._run_suite("quick", groups, [], 2, out, argparse.Namespace(budget=300.0, timeout=None, keep_work=False))
    res = json.loads((out / "results.json").read_text())
    assert rc == 0, res["runs"]
    rows = {r["system"]: r for r in res["sections"]["first_call"]["rows"]}
    assert rows["lazytriton, warm from Redis (new process, empty local cache)"]["samples"] == [0.6, 0.6]


def test_dry_run_warns_when_the_estimate_exceeds_the_budget(tmp_path, capsys, monkeypatch):
    # As on a machine of one GPU (with two, the full suite adds the distributed group's 200 s and says so).
    monkeypatch.setattr(cli, "_gpus", lambda: (1, ""))
    assert cli.main(["--suite", "full", "--dry-run", "--budget", "30", "--out", str(tmp_path / "x")]) == 0
    assert "WARNING: the estimate" in capsys.readouterr().out
    assert cli.main(["--suite", "full", "--dry-run", "--out", str(tmp_path / "x")]) == 0
    assert "WARNING" not in capsys.readouterr().out  # the full suite fits the default budget


def test_cold_scripts_are_python():
    for group, _, _, script, *_ in cold.ROWS:
        compile(script, group, "exec")  # they run only on a GPU: at least they parse


def test_timeline_phases_of_each_kind_of_row():
    jax_cold = {"first_call_s": 1.2, "lower_s": 0.01, "xla_compile_s": 0.09, "execute_s": 1.1, "import_s": 1,
                "handler": {"how": "built", "seconds": 0.5, "ready_after_s": 0.3},
                "resolutions": [{"kernel": "demo_matmul", "candidates": 8, "compiled_s": 0.7, "tuned_s": 1.0,
                                 "at": 1.15}]}
    lanes = {p[0]: p[1:] for p in cold.phases(jax_cold)}
    assert lanes["jit(...).lower()"] == [0.0, 0.01] and lanes["XLA compile"] == pytest.approx([0.01, 0.1])
    assert lanes["first execution"] == pytest.approx([0.1, 1.2]) and lanes["FFI handler (built)"] == [0.0, 0.3]
    assert lanes["compile + tune (overlapped)"] == pytest.approx([0.15, 1.15])
    warm = cold.phases({"first_call_s": 0.02, "stats": {}, "resolutions": []})
    assert warm == [["cached winner: load + launch", 0.0, 0.02]]
    assert cold.phases({"first_call_s": 5.0}) == [["compile + benchmark every config (serial)", 0.0, 5.0]]
    # The compile server's start-up shows where it reaches past the data being ready, not where it ended before.
    lazy_cold = {"first_call_s": 0.8, "server": {"started_at": -0.3, "imports_done_at": -0.1, "ready_at": 0.25},
                 "resolutions": [{"kernel": "demo_matmul", "candidates": 8, "compiled_s": 0.6, "tuned_s": 0.75,
                                  "at": 0.78}]}
    lanes = {p[0]: p[1:] for p in cold.phases(lazy_cold)}
    assert lanes["compile server start-up (background)"] == [0.0, 0.25]
    assert lanes["bind + cache lookup"] == pytest.approx([0.0, 0.03]) and lanes["first launch"] == [0.78, 0.8]
    lazy_cold["server"]["ready_at"] = -0.05
    assert "compile server start-up (background)" not in {p[0] for p in cold.phases(lazy_cold)}


# -- merging and the report ------------------------------------------------------------------


def _bars(title, unit, rows, ratio_to=None, **extra):
    return {"title": title, "unit": unit, "better": "lower", "rows": rows, "notes": [f"{title} note"],
            **({"ratio_to": ratio_to} if ratio_to else {}), **extra}


def _process_output(rep: int, rng: random.Random) -> dict:
    """One process's sections, as the workers write them (numbers invented)."""
    def s(v, n=6):
        return [v * (1 + 0.02 * rng.random()) for _ in range(n)]

    launch = [{"system": "raw cuLaunchKernel loop (C++)", "kind": "floor", "samples": s(2.7)},
              {"system": "lazytriton k[grid](...), torch", "kind": "lazytriton", "samples": s(3.6), "correct": True},
              {"system": "Triton's launcher kernel[grid](...)", "kind": "other", "samples": s(11.0)},
              {"system": "CUDA graph replay, per kernel", "kind": "floor", "samples": s(0.9)},
              {"system": "C++ program: typed stub, default bundle", "kind": "lazytriton", "samples": s(2.8)}]
    small = [{"system": f"softmax 32x1024 fp16: {k}", "kind": kind, "samples": s(v), "workload": "softmax 32x1024 fp16"}
             for k, kind, v in (("lazytriton k[grid](...)", "lazytriton", 4.0),
                                ("Triton's launcher (autotuner)", "other", 14.0), ("torch", "other", 6.0))]
    chain = [{"system": "lazytriton.jax, command buffers on", "kind": "lazytriton", "samples": s(1.0),
              "correct": True, "handler_runs_per_kernel": 0.0},
             {"system": "lazytriton.jax, command buffers off", "kind": "lazytriton", "samples": s(3.5),
              "correct": rep == 0, "handler_runs_per_kernel": 1.0},
             {"system": "floor: CUDA graph replay of the same cubin", "kind": "floor", "samples": s(0.95)}]
    ceil = {"copy_GBps": 4200.0 + rep, "matmul_TFLOPs": 700.0}

    def tp(w, system, kind, us, bound, nbytes, flops, **kw):
        rates = [flops / t / 1e6 if bound == "compute" else nbytes / t / 1e3 for t in s(us)]
        return {"system": f"{w}: {system}", "kind": kind, "samples": s(us), "workload": w, "rate": rates,
                "rate_unit": "TFLOP/s" if bound == "compute" else "GB/s", "bound": bound, "bytes": nbytes,
                "flops": flops, **kw}

    mm = 2 * 4096 ** 3
    throughput = [tp("softmax 8192x4096 fp16", "lazytriton", "lazytriton", 38.0, "memory", 4 * 8192 * 4096,
                     4 * 8192 * 4096, correct=True),
                  tp("softmax 8192x4096 fp16", "torch", "other", 110.0, "memory", 4 * 8192 * 4096, 4 * 8192 * 4096,
                     op="torch.softmax"),
                  tp("matmul 4096^3 fp16", "lazytriton", "lazytriton", 204.0, "compute", 6 * 4096 ** 2, mm,
                     correct=True),
                  tp("permute rows 8192x2048 fp32 (index-driven)", "lazytriton", "lazytriton", 40.0, "memory",
                     8 * 8192 * 2048, 0, correct=True)]
    jthroughput = [tp("matmul 4096^3 fp16", "lazytriton.jax triton_call", "lazytriton", 206.0, "compute",
                      6 * 4096 ** 2, mm, correct=True),
                   tp("matmul 4096^3 fp16", "XLA's op", "other", 199.0, "compute", 6 * 4096 ** 2, mm,
                      op="XLA: jnp.dot (cuBLAS)")]
    times = [210.0, 207.0, 260.0, 250.0, 400.0, 204.0 + rep, 230.0, float("inf")]
    tuning = [{"system": "matmul 4096^3 fp16", "kind": "lazytriton", "samples": [300.0 + rep],
               "configs": [f"cfg{i}" for i in range(8)], "times_us": times, "chosen": 5 if rep else 1, "best": 5,
               "ratio": times[5 if rep else 1] / times[5]}]
    return {"launch": _bars("Host cost per launch", "us/launch", launch, "raw cuLaunchKernel loop (C++)"),
            "small": _bars("Launch-bound sizes", "us/call", small),
            "chain": _bars("Per-kernel time in a chain", "us/kernel", chain,
                           "floor: CUDA graph replay of the same cubin"),
            "throughput": {"title": "Kernel time of tuned workloads", "unit": "us", "rows": throughput,
                           "ceilings": ceil, "notes": []},
            "jax_throughput": {"title": "From JAX", "unit": "us", "rows": jthroughput, "notes": []},
            "tuning": {"title": "Tuning quality", "unit": "ms", "rows": tuning, "notes": []}}


def _first_call_output(group: str, first: float) -> dict:
    raw = {"first_call_s": first, "imports_s": 3.0, "max_err": 0.01, "ref_max": 250.0}
    if group == "warm-lazy":
        raw.update(stats={"compiles": 0, "tunes": 0, "record_hits": 1}, resolutions=[])
    elif group == "cold-jax-runtime-handler":  # the FFI handler built at run time, wrong output
        raw.update(lower_s=0.01, xla_compile_s=0.1, execute_s=first - 0.11, backend_s=1.0, max_err=float("nan"),
                   handler={"how": "built", "seconds": 2.1, "ready_after_s": 2.2},
                   resolutions=[{"kernel": "m", "candidates": 8, "compiled_s": 0.7, "tuned_s": 1.0,
                                 "at": first - 0.02}])
    if group == "cold-lazy":
        raw.update(stats={"compiles": 8, "tunes": 1}, stub_events=[[0.0, "building launch stub"],
                                                                   [0.7, "built launch stub"]],
                   resolutions=[{"kernel": "m", "candidates": 8, "compiled_s": 0.8, "tuned_s": first - 0.1,
                                 "at": first - 0.05}])
    elif group == "cold-jax":
        raw.update(lower_s=0.01, xla_compile_s=0.1, execute_s=first - 0.11, backend_s=1.0,
                   resolutions=[{"kernel": "m", "candidates": 8, "compiled_s": 0.7, "tuned_s": 1.0,
                                 "at": first - 0.02}])
    return {"first_call": cold.section([cold.to_row(group, raw)], [])}


def _synthetic_results(tmp_path) -> dict:
    rng = random.Random(0)
    outputs = []
    for rep in range(3):
        outputs.append({"group": "torch+", "rep": rep, "sections": _process_output(rep, rng)})
        for group, first in (("cold-triton", 5.0), ("cold-lazy", 1.4), ("warm-lazy", 0.03), ("cold-jax", 1.3)):
            outputs.append({"group": group, "rep": rep, "sections": _first_call_output(group, first + 0.01 * rep)})
    outputs.append({"group": "cold-jax-runtime-handler", "rep": 0,
                    "sections": _first_call_output("cold-jax-runtime-handler", 3.1)})
    outputs.append({"group": "jax-cb-off", "rep": 1, "error": "exit 1; last output: boom", "planned": ["chain"]})
    # A section whose every process failed: no rows, its notes say why.
    for rep in range(2):
        outputs.append({"group": "distributed", "rep": rep, "error": "timed out after 90 s", "planned": ["distributed"]})
    outputs.append({"group": "warm-jax", "rep": 2, "not_run": "not run: the time budget (480 s) would be exceeded",
                    "planned": ["first_call"]})
    cpu_rows = [{"system": "lazytriton.jax: jit(...).lower() of the 8-config matmul", "kind": "lazytriton",
                 "samples": [2.9, 1.6, 3.1]},
                {"system": "compile config 0 (BM=128)", "kind": "lazytriton", "samples": [609.0], "config": "c0"},
                {"system": "compile config 1 (BM=128)", "kind": "lazytriton", "samples": [float("nan")],
                 "config": "c1", "error": "PTXASError"},
                {"system": "launch stub build (generated C, g++)", "kind": "lazytriton", "samples": [715.0]}]
    outputs.append({"group": "cpu", "rep": 0, "sections": {"cpu": _bars("Without a GPU", "ms", cpu_rows)}})
    return {"command": "lazytriton bench --suite full", "suite": "full", "processes_per_group": 3,
            "started": "2026-11-30T10:00:00", "finished": "2026-11-30T10:06:00", "wall_s": 360.0,
            "environment": {"device": "NVIDIA H200", "triton": "3.6.0"}, "skipped": ["TMA persistent matmul: hook"],
            "runs": [{"group": "jax-cb-off", "rep": 1, "ok": False, "error": "exit 1; last output: boom"},
                     {"group": "distributed", "rep": 0, "ok": False, "error": "timed out after 90 s"},
                     {"group": "distributed", "rep": 1, "ok": False, "error": "timed out after 90 s"},
                     {"group": "warm-jax", "rep": 2, "ok": True, "wall_s": 0.0,
                      "not_run": "not run: the time budget (480 s) would be exceeded"}],
            "sections": cli.merge(outputs)}


def test_merge_pools_processes_by_row_and_keeps_each_process():
    res = _synthetic_results(None)
    secs = res["sections"]
    assert list(secs) == ["launch", "small", "chain", "throughput", "jax_throughput", "tuning", "first_call",
                          "distributed", "cpu"]
    assert secs["distributed"]["rows"] == [] and len(secs["distributed"]["notes"]) == 2
    assert any("warm-jax, process 3: not run: the time budget" in n for n in secs["first_call"]["notes"])
    raw = secs["launch"]["rows"][0]
    assert raw["system"] == "raw cuLaunchKernel loop (C++)" and len(raw["process_samples"]) == 3
    assert len(raw["samples"]) == 18 and len(raw["per_process"]) == 3
    off = next(r for r in secs["chain"]["rows"] if r["system"].endswith("command buffers off"))
    assert off["correct"] is False  # wrong in one process: wrong
    assert any("jax-cb-off, process 2: FAILED (exit 1" in n for n in secs["chain"]["notes"])
    assert [c["copy_GBps"] for c in secs["throughput"]["ceilings_per_process"]] == [4200.0, 4201.0, 4202.0]
    assert len(secs["throughput"]["rows"][0]["rate"]) == 18
    first = {r["system"]: r for r in secs["first_call"]["rows"]}
    assert list(first) == [
        "Triton's @triton.autotune, cold", "lazytriton, cold", "lazytriton, warm (new process, persisted winner)",
        "lazytriton.jax, cold", "lazytriton.jax, cold, FFI handler built at run time"]
    assert first["lazytriton, cold"]["correct"] is True  # max_err within the fp16 tolerance of ref_max
    assert first["lazytriton.jax, cold, FFI handler built at run time"]["correct"] is False  # NaN error: wrong
    assert report.ceilings(res)["copy_GBps"] == 4201.0
    t = report.tuning_summary(secs["tuning"]["rows"][0])
    assert t["chosen"] == [1, 5, 5] and t["best"] == 5 and t["times"][7] == float("inf")
    assert t["ratio"] == pytest.approx(1.0)


def test_report_and_every_plot_from_a_synthetic_results_json(tmp_path):
    pytest.importorskip("matplotlib")
    res = _synthetic_results(tmp_path)
    (tmp_path / "results.json").write_text(json.dumps(res))
    assert cli.main(["--report-only", "--out", str(tmp_path)]) == 0
    md = (tmp_path / "report.md").read_text()
    for png in ("launch", "small", "chain", "throughput", "roofline", "tuning", "first_call", "cpu"):
        assert (tmp_path / f"{png}.png").stat().st_size > 5000, png
        assert f"]({png}.png)" in md
    assert not (tmp_path / "distributed.png").exists()  # no rows, no plot: the section says why
    dist = md.split("## distributed")[1]
    assert dist.count("FAILED (timed out after 90 s)") == 2 and "No row measured" in dist
    assert "**Processes not run:**" in md and "warm-jax (process 3): not run: the time budget" in md
    assert "| compile config 1 (BM=128) | ? |" in md and "failed" in md  # a NaN sample and its error
    assert "FFI handler built at run time" in md
    assert "| raw cuLaunchKernel loop (C++) (floor) | 2.7" in md and "| 1.00x |" in md
    triton_row = r"\| Triton's launcher kernel\[grid\]\(\.\.\.\) \| 11\.\d \| [\d.]+-[\d.]+ \| [\d.]+-[\d.]+ \| 4\.\d+x"
    assert re.search(triton_row, md)
    assert "**WRONG RESULT**" in md and "handler runs/kernel 0.000" in md
    assert "FAILED (exit 1" in md and "**Failed processes:**" in md
    assert "Ceilings measured in this run: copy 4201 GB/s, fp16 matmul 700 TFLOP/s." in md
    assert re.search(r"\| matmul 4096\^3 fp16 \| lazytriton \| 20\d\.?\d* \|", md)
    assert "| matmul 4096^3 fp16 | 1 (207.0 us), 5 (205.0 us), 5 (205.0 us) | 5 (205.0 us) | 1.000 |" in md
    assert "x faster" in md and "compiles 8, tunes 1" in md and "before the clock: imports 3.00 s" in md
    assert "Skipped:" in md and "TMA persistent matmul" in md


def _markdown_tables(md: str) -> list[list[list[str]]]:
    tables, current = [], None
    for line in md.splitlines():
        if line.startswith("|") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if current is None:
                current = []
                tables.append(current)
            current.append(cells)
        elif not line.startswith("| ---"):
            current = None
    return tables


REAL_RUN = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "results-h200-full.json"


def test_report_of_a_real_run_has_no_empty_column_and_no_label_cut_at_an_edge(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    md = report.write(json.loads(REAL_RUN.read_text()), tmp_path).read_text()
    for header, *rows in _markdown_tables(md)[1:]:  # the first: the environment's key-value table
        assert all(any(r[j] for r in rows) for j in range(len(header))), header
    pngs = sorted(tmp_path.glob("*.png"))
    assert len(pngs) == 8
    for png in pngs:  # a white margin all round: no system name or caption runs off the image
        img = matplotlib.image.imread(png)[:, :, :3]
        for edge in (img[:, :4], img[:, -4:], img[:4], img[-4:]):
            assert edge.min() > 0.95, png.name


def test_bar_values_clear_their_whiskers_and_floors_are_named_where_drawn():
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    sections = json.loads(REAL_RUN.read_text())["sections"]
    for name in ("launch", "chain", "cpu"):
        fig = report.bars_figure(sections[name])
        ax = fig.axes[0]
        [bars] = [c for c in ax.containers if hasattr(c, "errorbar")]
        [whiskers] = bars.errorbar.lines[2]
        right = {round(seg[1][1]): max(seg[0][0], seg[1][0]) for seg in whiskers.get_segments()}
        for text in ax.texts:
            x, y = text.get_position()
            assert x >= right[round(y)], (name, text.get_text())  # the value is not struck through
        floors = any(r["kind"] == "floor" for r in sections[name]["rows"])
        assert ("floors" in ax.get_xlabel()) == floors, (name, ax.get_xlabel())
        matplotlib.pyplot.close(fig)


def test_report_when_the_ceilings_were_not_measured(tmp_path):
    """A throughput process that could not measure the device's roofs still reports its kernel times."""
    pytest.importorskip("matplotlib")
    res = _synthetic_results(tmp_path)
    nan = {"copy_GBps": float("nan"), "matmul_TFLOPs": float("nan")}
    res["sections"]["throughput"]["ceilings_per_process"] = [nan, nan, nan]
    md = report.write(res, tmp_path).read_text()
    assert "| softmax 8192x4096 fp16 | lazytriton |" in md and (tmp_path / "throughput.png").exists()
    assert not (tmp_path / "roofline.png").exists()  # no roofs to draw


def test_report_without_matplotlib_sections_still_renders(tmp_path, monkeypatch):
    res = _synthetic_results(tmp_path)
    monkeypatch.setattr(report, "_plots", lambda results, out: {})  # the tables need no plotting library
    md = report.write(res, tmp_path).read_text()
    assert "## Host cost per launch" in md and "![" not in md


# -- pieces the GPU suites run, checked without a GPU ----------------------------------------------


def test_cpp_program_builds_and_refuses_a_missing_bundle(tmp_path):
    names = re.findall(r'\{"([^"]+)", \[&\]', cpp.source().read_text())
    assert names == [n for n, _ in cpp.PATHS]  # the rows --dry-run lists are the program's
    prog = cpp.build(tmp_path)
    assert prog.exists() and cpp.build(tmp_path) == prog  # built once
    r = subprocess.run([str(prog), str(tmp_path / "no-bundle"), "2", "2"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "error:" in r.stderr and "no-bundle" in r.stderr
    r = subprocess.run([str(prog), str(tmp_path), "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "positive" in r.stderr


def test_ffi_floor_handlers_build_and_every_chain_lowers_for_cuda(tmp_path, monkeypatch):
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    from lazytriton.bench import jax_group

    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path / "cache"))
    mod = jax_group._ffi_floor_module(None)
    assert mod.runs() == 0 and set(mod.handlers()) == {"noop", "raw"}
    x = jax.ShapeDtypeStruct((jax_group.N,), jnp.float32)
    for what in ("lazytriton", "lazytriton-donated", "xla", "ffi-raw", "ffi-noop", "ffi-raw-donated"):
        f, _, _ = jax_group._chain_fn(what)
        text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
        if what.startswith("ffi"):
            assert text.count(f"lt_bench_{what.split('-')[1]}") == jax_group.CHAIN
        elif what.startswith("lazytriton"):
            assert text.count("custom_call") == jax_group.CHAIN
        if what.endswith("donated"):
            assert "tf.aliasing_output" in text or "jax.buffer_donor" in text
    names = [r for r, _, _ in jax_group.chain_rows(True)] + [r for r, _, _ in jax_group.chain_rows(False)]
    assert len(names) == len(set(names))


def test_jax_workload_paths_lower_for_cuda_and_their_checks_can_fail():
    pytest.importorskip("jax")
    import jax.numpy as jnp
    import numpy as np

    from lazytriton.bench import workloads as w

    for setup in (w._j_vector_add(4096), w._j_softmax(64, 256), w._j_layer_norm(64, 256), w._j_matmul(128, 64, 256),
                  w._j_permute(64, 32), w._j_inplace(4096)):
        p = setup()
        assert {k for _, k in p["fns"].values()} == {"lazytriton", "other"}
        for name, (fn, _) in p["fns"].items():
            text = fn.trace(*p["args"]).lower(lowering_platforms=("cuda",)).as_text()
            assert ("custom_call" in text) == name.startswith(("lazytriton", "jax-triton")), name
        if "first" in p:  # the in-place update: exactly one update of 2x
            first, check_first = p["first"]
            once = jnp.asarray(np.asarray(p["args"][0]) * 2)
            assert check_first(once) and p["check"](once)
            assert not check_first(p["args"][0]) and not check_first(jnp.asarray(np.asarray(once) * 2))
            first.trace(*p["args"]).lower(lowering_platforms=("cuda",))
            continue
        xla = next(fn for n, (fn, _) in p["fns"].items() if n.startswith("XLA"))
        good = xla(*p["args"])  # XLA's op on the CPU: a right answer the check must accept
        assert p["check"](good)
        assert not p["check"](jnp.full_like(good, jnp.nan))


def test_table_driven_row_serves_its_first_call_without_a_stub_build(monkeypatch, tmp_path):
    """The launch table's table-driven rows: the kernel's first call is made under
    LAZYTRITON_STUB_BUILD=off, so the table-driven stub (not a generated one) is what serves
    that shape for good; the setting is restored afterwards, also when the call fails."""
    from lazytriton.runtime import stubgen
    from lazytriton.model.arrays import DTYPE_IDS
    from lazytriton.runtime.stubgen import Shape, Slot

    monkeypatch.setenv("LAZYTRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LAZYTRITON_STUB_BUILD", "sync")
    shape = Shape(("p", "n"), (Slot("ptr", dtype=DTYPE_IDS["fp32"]), Slot("int", int_type="i32")))
    served = []
    k = object()
    assert torch_group._table_driven(k, lambda f: served.append((f, stubgen.stub_now(shape)))) is k
    assert served[0][0] is k and type(served[0][1]).__name__ == "Stub"  # the table-driven stub, nothing built
    assert os.environ["LAZYTRITON_STUB_BUILD"] == "sync"
    monkeypatch.delenv("LAZYTRITON_STUB_BUILD")
    with pytest.raises(ZeroDivisionError):
        torch_group._table_driven(k, lambda f: 1 / 0)
    assert "LAZYTRITON_STUB_BUILD" not in os.environ


def test_jax_chain_worker_runs_on_the_cpu_backend_and_checks_its_rows(tmp_path):
    """The command-buffers-off JAX process end to end on JAX's CPU backend: XLA's own chain is measured
    and checked; the rows that need CUDA (lazytriton, the FFI floors, CuPy's floors) or jax-triton are
    absent with a note each, and the process still succeeds."""
    pytest.importorskip("jax")
    from lazytriton.bench import jax_group

    out = tmp_path / "chain.json"
    env = {**ENV, "XLA_FLAGS": jax_group.CB_OFF, "JAX_PLATFORMS": "cpu", "LAZYTRITON_CACHE_DIR": str(tmp_path / "c")}
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--worker", "jax-cb-off", "--suite", "quick",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    chain = json.loads(out.read_text())["sections"]["chain"]
    rows = {row["system"]: row for row in chain["rows"]}
    xla = rows.pop("XLA's own add (unfused), command buffers off")
    assert xla["correct"] is True and len(xla["samples"]) == 8 and all(v > 0 for v in xla["samples"])
    notes = " ".join(chain["notes"])
    for name, _, what in jax_group.chain_rows(False):
        assert name in rows or what == "xla" or f"{name}: not measured" in notes, name
    # A JAX process given the other command-buffer setting refuses to measure.
    env["XLA_FLAGS"] = jax_group.CB_ON
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--worker", "jax-cb-off", "--suite", "quick",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path), env=env)
    assert r.returncode != 0 and "needs XLA_FLAGS" in r.stderr


def test_jax_throughput_section_on_the_cpu_backend(monkeypatch):
    """The JAX throughput section's orchestration (setups, donated copies, interleaving, rates, notes)
    with the workloads at small sizes on JAX's CPU backend: XLA's ops are measured, every lazytriton
    row (CUDA only) is absent with a note naming the workload."""
    jax = pytest.importorskip("jax")
    if jax.default_backend() != "cpu":
        pytest.skip("checks the CPU backend")
    from lazytriton.bench import jax_group
    from lazytriton.bench import workloads as w

    small = [w.Workload("vector add 4096", 3 * 4 * 4096, 4096, "memory", jax=w._j_vector_add(4096)),
             w.Workload("matmul 64x32x128", 2 * (64 * 128 + 128 * 32 + 64 * 32), 2 * 64 * 32 * 128, "compute",
                        jax=w._j_matmul(64, 32, 128)),
             w.Workload("in-place 4096", 8 * 4096, 4096, "memory", jax=w._j_inplace(4096))]
    monkeypatch.setattr(jax_group, "throughput_workloads", lambda suite: small)
    sec = jax_group._throughput_section(lambda msg: None, "quick")
    rows = {r["system"]: r for r in sec["rows"]}
    assert set(rows) == {f"{x.name}: XLA's op" for x in small}
    mm = rows["matmul 64x32x128: XLA's op"]
    assert mm["op"] == "jnp.dot (cuBLAS)" and mm["rate_unit"] == "TFLOP/s" and len(mm["samples"]) == 10
    assert mm["rate"][0] == pytest.approx(mm["flops"] / mm["samples"][0] / 1e6)
    vadd = rows["vector add 4096: XLA's op"]
    assert vadd["rate"][0] == pytest.approx(vadd["bytes"] / vadd["samples"][0] / 1e3) and vadd["rate_unit"] == "GB/s"
    notes = " ".join(sec["notes"])
    for x in small:
        assert f"{x.name}: lazytriton.jax triton_call: not measured" in notes


def test_throughput_workloads_count_bytes_and_flops():
    from lazytriton.bench import workloads as w

    full = {x.name: x for x in w.throughput_workloads("full")}
    assert full["matmul 4096^3 fp16"].flops == 2 * 4096 ** 3 and full["matmul 4096^3 fp16"].bound == "compute"
    assert full["vector add 64M fp32"].bytes == 12 * (1 << 26)
    assert all(x.bytes > 0 and x.bound in ("memory", "compute") for x in full.values())
    quick = {x.name for x in w.throughput_workloads("quick")}
    assert quick < set(full) and "matmul 1024x1024x8192 fp16" not in quick
    assert all(x.torch is not None for x in full.values())


# -- on a GPU ----------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.exclusive_gpu
def test_gpu_quick_suite_measures_every_planned_row_correctly(tmp_path):
    """The quick suite on this GPU: every row --dry-run plans is measured (or
    its absence is explained by a note), no process fails, every lazytriton
    row that checks its result is right, and the report has its plots."""
    out = tmp_path / "bench"
    # A budget and a timeout that leave a 10-minute device command room to report a failure.
    r = subprocess.run([sys.executable, "-m", "lazytriton.bench", "--suite", "quick", "--budget", "300", "--out",
                        str(out)], capture_output=True, text=True, timeout=450, cwd=str(tmp_path), env=ENV)
    assert r.returncode == 0, r.stderr[-5000:]
    res = json.loads((out / "results.json").read_text())
    assert all(run["ok"] and not run.get("not_run") for run in res["runs"]), res["runs"]
    groups, _ = plan.build("quick", gpus=1)
    for g in groups:
        for sec, planned in g.rows.items():
            got = {row["system"] for row in res["sections"][sec]["rows"]}
            notes = " ".join(res["sections"][sec].get("notes", []))
            for name in planned:
                absent_ok = name.startswith("jax-triton") or "jax-triton" in name
                assert name in got or (absent_ok and "jax-triton" in notes), f"{sec}: {name} missing; notes: {notes}"
    for sec in res["sections"].values():
        for row in sec["rows"]:
            assert row.get("correct", True), f"{row['system']}: wrong result"
            assert row["samples"] and all(math.isfinite(v) and v > 0 for v in row["samples"]), row["system"]
    launch = {row["system"]: report.median_process(row) for row in res["sections"]["launch"]["rows"]}
    assert launch["lazytriton C++ core loop"] < 2 * launch["raw cuLaunchKernel loop (C++)"]
    chain = {row["system"]: row for row in res["sections"]["chain"]["rows"]}
    assert chain["lazytriton.jax, command buffers on"]["handler_runs_per_kernel"] < 0.1  # replayed, not run
    assert chain["lazytriton.jax, command buffers off"]["handler_runs_per_kernel"] == pytest.approx(1.0, abs=0.05)
    tuning = res["sections"]["tuning"]["rows"]
    assert tuning and all(report.tuning_summary(t)["ratio"] < 1.25 for t in tuning)
    first = {row["system"]: row for row in res["sections"]["first_call"]["rows"]}
    assert report.median_process(first["lazytriton, warm (new process, persisted winner)"]) < \
        report.median_process(first["lazytriton, cold"])
    for png in ("launch", "chain", "throughput", "tuning", "first_call", "cpu"):
        assert (out / f"{png}.png").stat().st_size > 5000, png
    # The estimates (plan.py) are what keep the full suite inside its budget: each process within 2x of its own.
    slow = [f"{run['group']}: {run['wall_s']:.0f} s (estimate {run['estimate_s']:.0f} s)" for run in res["runs"]
            if run["wall_s"] > 2 * run["estimate_s"] + 5]
    assert not slow, f"processes far slower than their estimate: {slow}"


def test_field_sections_from_a_measurement(tmp_path):
    """lazytriton/bench/field.py: measure()'s numbers (every row a fresh process on
    a GPU) as the harness's two sections, their tables and plots; a row that
    failed becomes a note."""
    from lazytriton.bench import field

    # The tunes are the tuner's own seconds in trials (tune_s): the first kernel's trials ran mostly
    # beside its compiles, so what was left once its last candidate was ready (the tail) is shorter.
    timings = [{"compiled_s": 0.6, "tuned_s": 0.65, "tune_s": 0.2, "compile_s": 3.0},
               {"compiled_s": 1.2, "tuned_s": 1.3, "tune_s": 0.1, "compile_s": 6.0}]
    ref = field.reference(timings)
    assert ref["slowest_compile_s"] == 1.2 and abs(ref["sum_tunes_s"] - 0.3) < 1e-9
    assert abs(ref["ref_s"] - 1.5) < 1e-9 and ref["compile_s"] == 9.0 and ref["cores"] >= 1
    assert abs(ref["tail_tunes_s"] - 0.15) < 1e-9 and abs(ref["tail_ref_s"] - 1.35) < 1e-9
    # Timings from before the tuner counted its seconds: the tails.
    assert abs(field.reference([{k: v for k, v in t.items() if k != "tune_s"} for t in timings])["ref_s"] - 1.35) < 1e-9
    # The less noisy reference: each kernel's median over the serial runs, then the same sum.
    runs = [timings, [dict(t, compiled_s=t["compiled_s"] + 0.9, tune_s=t["tune_s"] / 2) for t in timings],
            [dict(t, compiled_s=t["compiled_s"] - 0.1) for t in timings]]
    med = field.median_timings(runs)
    assert [t["compiled_s"] for t in med] == [0.6, 1.2] and [t["tune_s"] for t in med] == [0.2, 0.1]
    assert abs(field.reference(med)["ref_s"] - 1.5) < 1e-9
    res = {"lazytriton": {"first_s": 1.3, "all_first_s": [1.2, 1.3, 1.4]},
           "threads": {"first_s": 1.35, "all_first_s": [1.3, 1.35, 1.5]},
           "triton": {"failed": True, "error": "RuntimeError: no GPU"},
           "warm": {"first_s": 0.04, "compiles": 0, "tunes": 0, "record_hits": 1},
           "jax_one": {"first_s": 1.5, "all_first_s": [1.4, 1.5, 1.6]},
           "jax_one_threads": {"first_s": 1.25, "all_first_s": [1.2, 1.25, 1.3]},
           "jax_ahead": {"first_s": 3.5, "all_first_s": [3.4, 3.5, 4.1], "compiles": 76, "tunes": 16},
           "jax_serial": {"first_s": 6.0, "all_first_s": [6.0, 6.1, 6.4]},
           "jax_warm": {"first_s": 0.2, "compiles": 0, "tunes": 0, "record_hits": 16},
           "jax_reference": ref,
           "sa_late": {"first_s": 3.6, "compiles": 76, "tunes": 16}}
    secs = field.sections(res)
    one, prog = secs["field"], secs["field_program"]
    assert [r["system"] for r in one["rows"]] == [field.ONE_ROWS[i] for i in (0, 1, 3, 4, 5)]
    # The JAX face against its own in-process threads (the section's ratios are to the standalone ones).
    assert "lazytriton.jax against its own in-process threads: 1.20x" in one["notes"], one["notes"]
    assert any("triton: FAILED (RuntimeError: no GPU)" in n for n in one["notes"])
    assert [r["kind"] for r in prog["rows"]] == ["lazytriton", "lazytriton", "lazytriton", "floor", "lazytriton"]
    assert prog["rows"][4]["system"] == field.PROGRAM_ROWS[8] and prog["rows"][4]["samples"] == [3.6]
    assert prog["rows"][3]["samples"] == [ref["ref_s"]] and prog["ratio_to"] == field.PROGRAM_ROWS[3]
    assert any("jax_warm: compiles 0, tunes 0" in n for n in prog["notes"])
    md = report.write({"suite": "quick", "sections": cli.merge([{"group": "field", "rep": 0, "sections": secs}])},
                      tmp_path)
    text = md.read_text()
    assert "| in-process threads (LAZYTRITON_COMPILE_WORKERS=0) | 1.35 |" in text
    assert "(floor)" in text and "2.33x" in text  # the JAX first step against the reference (3.5 / 1.5)
    assert (tmp_path / "field.png").exists() and (tmp_path / "field_program.png").exists()


def test_a_field_programs_step_is_broken_down_where_it_went():
    """lazytriton/bench/field.py step_breakdown: from a run's compile history and timings (the step's
    clock from t0): when the first compile was queued, the compile that ended last, the full
    collections, and the sites that ended after it (their trials, isolated first launches, the rest)."""
    from lazytriton.bench import field

    t0 = 100.0
    hist = [{"label": "body config 1 (BM: 128)", "queued": t0 + 0.1, "front_end": t0 + 0.15,
             "front_end_done": t0 + 0.17, "job_done": t0 + 1.9, "job_s": 1.7},
            {"label": "body config 7 (BM: 64)", "queued": t0 + 0.1, "front_end": t0 + 0.3,
             "front_end_done": t0 + 0.33, "job_done": t0 + 2.1, "job_s": 1.75},
            {"label": "body config 0 (BLOCK: 256)", "queued": t0 + 0.12, "front_end": t0 + 0.5,
             "front_end_done": t0 + 0.52, "job_done": t0 + 0.8, "job_s": 0.25}]
    timings = [{"at": t0 + 1.8, "tune_s": 0.05, "isolated_s": 0.01},  # ended before the last compile
               {"at": t0 + 2.3, "tune_s": 0.12, "isolated_s": 0.02},
               {"at": t0 + 2.5, "tune_s": 0.1, "isolated_s": 0.03}]
    run = {"t0": t0, "first_s": 2.5, "compile_history": hist, "timings": timings, "gc": [[2, 0.18, 0.13]]}
    b = field.step_breakdown(run)
    assert abs(b["first_queued_s"] - 0.1) < 1e-9 and b["last_compile"]["label"].startswith("body config 7")
    assert abs(b["last_compile"]["front_end_s"] - 0.3) < 1e-9 and abs(b["last_compile"]["done_s"] - 2.1) < 1e-9
    assert b["full_collections"] == [[0.18, 0.13]] and b["sites_after"] == 2
    assert abs(b["tail_s"] - 0.4) < 1e-9 and abs(b["tail_trials_s"] - 0.22) < 1e-9
    assert abs(b["tail_isolated_s"] - 0.05) < 1e-9 and abs(b["tail_other_s"] - 0.13) < 1e-9
    (note,) = field.breakdown_notes({"jax_ahead": run, "sa_ahead": {"first_s": 3.0}})  # no history: no note
    assert note.startswith("JAX 16 sites, compiled ahead, the median run: first compile queued at +0.10 s; the last "
                           "compile to end (body config 7) started its front end at +0.30 s, ran 1.75 s"), note
    assert "full collections: 0.13 s at +0.18 s; then 2 sites in 0.40 s: trials 0.22 s" in note, note
    assert field.step_breakdown({"first_s": 1.0}) is None


def test_a_field_row_says_what_isolated_first_launches_cost_it(tmp_path):
    """lazytriton/bench/field.py one_process: a row's line names its isolated first launches, their
    seconds and how the buffers went (IPC, device copies by IPC, or staged), so a GPU run answers which
    path XLA's take."""
    from lazytriton.bench import field

    script = ("import json, sys; json.dump({'first_s': 1.5, 'import_s': 0.5, 'isolation': {'jobs': 76, "
              "'isolated_s': 0.84, 'ipc_buffers': 0, 'copied_buffers': 200, 'staged_buffers': 28}}, "
              "open(sys.argv[1], 'w'))")
    said = []
    r = field.one_process(script, {}, str(tmp_path), str(tmp_path), "row", say=said.append)
    assert r["isolation"]["jobs"] == 76
    assert said == ["  row: first 1.50 s (import 0.50 s); 76 first launches isolated, 0.84 s (helper start "
                    "included), buffers: 0 by IPC, 200 as device copies by IPC, 28 staged through host memory"]
