"""`lazytriton bench` (also `python -m lazytriton.bench`): runs a suite's
processes (plan.py), shows progress (what runs, what is left), merges every
process's samples and writes results.json (after every process), report.md
and plots. A time budget (--budget) keeps the run inside a device session:
processes that would overrun it are not started, and the report says so."""
from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import plan, redis_server, report
from .common import progress

DEFAULT_PROCESSES = {"cpu": 1, "quick": 1, "full": 3}
DEFAULT_BUDGET_S = 500.0  # with the grace and the report, 9 minutes: inside a 10-minute device command
BUDGET_GRACE_S = 30.0     # how far past the budget a running process may go before it is stopped


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--suite", choices=plan.SUITES, default=None,
                   help="cpu: what needs no GPU (CI); quick: 2-3 minutes on a GPU, one process per group; full: "
                        "every system, workload and shape (about 8 minutes with --processes 3) "
                        "(default: quick with a GPU, else cpu)")
    p.add_argument("--out", default="lazytriton-bench", help="directory for results.json, report.md and plots")
    p.add_argument("--processes", type=int, default=None,
                   help="repetitions: every group runs in this many fresh processes (default: 3 for full, 1 for "
                        "quick)")
    p.add_argument("--only", default=None,
                   help="comma-separated sections to run (" + ", ".join(plan.SECTION_ORDER) + "): the groups that "
                        "contribute to them")
    p.add_argument("--workloads", default=None,
                   help="comma-separated parts of workload names, case-sensitive (e.g. 'TMA,attention'): only those "
                        "workloads in the small, throughput, jax_throughput and tuning sections")
    p.add_argument("--dry-run", action="store_true", help="list the processes and rows the suite would run, and "
                                                          "the time they are expected to take; run nothing")
    p.add_argument("--report-only", action="store_true",
                   help="render report.md and the plots again from OUT/results.json (e.g. of a run cut short)")
    p.add_argument("--timeout", type=float, default=None,
                   help="seconds one process may run (default: 4x its estimate, at least 90 s, at most 300 s; the "
                        "cpu suite: 300 s)")
    p.add_argument("--budget", type=float, default=DEFAULT_BUDGET_S,
                   help=f"seconds the whole run may take (default {DEFAULT_BUDGET_S:.0f}; 0: no limit): a process "
                        "whose estimate would end past it is not started (the report lists it), and a process still "
                        f"running {BUDGET_GRACE_S:.0f} s past it is stopped, so that results.json, report.md and the "
                        "plots are always written (a device session's command may run 10 minutes)")
    p.add_argument("--keep-work", action="store_true", help="keep OUT/.work (the run's caches and builds)")
    p.add_argument("--worker", help=argparse.SUPPRESS)  # internal: one group's process
    p.add_argument("--json", help=argparse.SUPPRESS)    # internal: where the worker writes its sections


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lazytriton bench", description=__doc__)
    add_arguments(p)
    return run(p.parse_args(argv))


def _gpus() -> tuple[int, str]:
    import lazytriton

    ok, why = lazytriton.gpu_available()
    if not ok:
        return 0, why
    from lazytriton import _core

    return int(_core.device_count()), ""


def run(args) -> int:
    if args.worker:
        return _worker(args.worker, args.suite, args.json)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        print(f"lazytriton bench: --out {out} is a file; it names the directory for results.json, report.md and "
              "the plots", file=sys.stderr)
        return 2
    if args.report_only:
        try:
            results = json.loads((out / "results.json").read_text())
        except FileNotFoundError:
            print(f"lazytriton bench --report-only: no {out / 'results.json'} (--out names the directory of an "
                  "earlier run)", file=sys.stderr)
            return 2
        except (OSError, ValueError) as exc:
            print(f"lazytriton bench --report-only: cannot read {out / 'results.json'}: {exc}", file=sys.stderr)
            return 1
        md = report.write(results, out)
        progress(f"wrote {md} and {len(list(out.glob('*.png')))} plot(s) from {out / 'results.json'}")
        return 0
    if args.workloads:  # read by workloads.selected, here and in every process the run starts
        os.environ["LAZYTRITON_BENCH_WORKLOADS"] = args.workloads
    gpus, why = _gpus()
    suite = args.suite or ("quick" if gpus else "cpu")
    if suite != "cpu" and not gpus and not args.dry_run:
        print(f"lazytriton bench --suite {suite}: no GPU here ({why}); run --suite cpu", file=sys.stderr)
        return 2
    n = args.processes if args.processes is not None else DEFAULT_PROCESSES[suite]
    if n < 1:
        print("--processes must be at least 1", file=sys.stderr)
        return 2
    wanted = {s.strip() for s in args.only.split(",") if s.strip()} if args.only else None
    groups, skipped = plan.build(suite, gpus=max(gpus, 1), only=wanted)
    if args.only:
        unknown = wanted - set(plan.SECTION_ORDER)
        if unknown:
            print(f"--only: unknown section(s) {', '.join(sorted(unknown))} (sections: "
                  f"{', '.join(plan.SECTION_ORDER)})", file=sys.stderr)
            return 2
        groups = [g for g in groups if wanted & set(g.sections)]
    if args.dry_run:
        text = plan.summary(suite, groups, skipped, n)
        est = plan.estimate_s(groups, n)
        if args.budget and est > args.budget:
            text += (f"\n\nWARNING: the estimate ({est / 60:.1f} min) exceeds --budget ({args.budget / 60:.1f} min): "
                     "the processes that would end past it will not run")
        print(text + ("" if gpus else "\n\n(no GPU here: listed as on one GPU)"))
        return 0
    return _run_suite(suite, groups, skipped, n, out, args)


def _run_suite(suite: str, groups: list, skipped: list[str], n: int, out: Path, args) -> int:
    t_run = time.perf_counter()
    try:
        out.mkdir(parents=True, exist_ok=True)
        work = (out / ".work").resolve()
        work.mkdir(exist_ok=True)
    except OSError as exc:
        print(f"lazytriton bench: cannot make --out {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    todo = plan.schedule(groups, n)
    results = {"command": _command(), "suite": suite, "processes_per_group": n,
               "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "environment": _environment(),
               "skipped": skipped, "estimate_s": plan.estimate_s(groups, n), "runs": [], "sections": {}}
    progress(f"suite {suite}: {len(todo)} processes in {n} repetition(s), about "
             f"{results['estimate_s'] / 60:.1f} min by estimate (--dry-run lists them)")
    for note in skipped:
        progress(f"skipped: {note}")
    outputs = []
    servers: dict = {}  # the run's Redis server, started for the first row that needs one
    budget = args.budget or float("inf")
    ok_runs: set = set()  # (group, rep) that succeeded
    for i, (g, rep) in enumerate(todo, 1):
        est = g.est_s[0 if rep == 0 else 1]
        left = sum(h.est_s[0 if r == 0 else 1] for h, r in todo[i:])
        elapsed = time.perf_counter() - t_run
        why = None
        if elapsed + est > budget:
            # Over the time budget: not started, so that what was measured is reported in time.
            why = f"not run: the time budget ({budget:.0f} s) would be exceeded ({elapsed:.0f} s elapsed, ~{est:.0f} s more)"
        elif (need := next((d for d in (g.fresh_cache, g.seeded_from) if d and d != g.name), None)) \
                and (need, rep) not in ok_runs:
            # A warm row runs on the caches its cold row left in this repetition (in its directory, or
            # pushed to the run's Redis): without them it would be cold.
            why = f"not run: it needs the caches of {need}, process {rep + 1}, which did not complete"
        if why:
            progress(f"[{i}/{len(todo)}] {g.name} (process {rep + 1}): {why}")
            outputs.append({"group": g.name, "rep": rep, "sections": None, "not_run": why, "planned": g.sections})
            results["runs"].append({"group": g.name, "rep": rep, "wall_s": 0.0, "estimate_s": est, "ok": True,
                                    "not_run": why})
            results["sections"] = merge(outputs)
            continue
        progress(f"[{i}/{len(todo)}] {g.name}: {g.title} (process {rep + 1}/{plan.processes_of(g, n)}, ~{est:.0f} s); "
                 f"left after it: {len(todo) - i} processes, ~{left:.0f} s")
        timeout = min(args.timeout or default_timeout(suite, est), max(30.0, budget + BUDGET_GRACE_S - elapsed))
        t0 = time.perf_counter()
        sections, error = _process(g, rep, suite, work, timeout, servers)
        wall = time.perf_counter() - t0
        outputs.append({"group": g.name, "rep": rep, "sections": sections, "error": error,
                        "planned": g.sections})
        if error is None:
            ok_runs.add((g.name, rep))
        results["runs"].append({"group": g.name, "rep": rep, "wall_s": round(wall, 2), "estimate_s": est,
                                "ok": error is None, **({"error": error} if error else {})})
        progress(f"[{i}/{len(todo)}] {g.name}: {'done' if error is None else 'FAILED'} in {wall:.1f} s "
                 f"(elapsed {time.perf_counter() - t_run:.0f} s)")
        results["sections"] = merge(outputs)
        (out / "results.json").write_text(json.dumps(results, indent=1))
    for server in servers.values():
        server.stop()
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    results["wall_s"] = round(time.perf_counter() - t_run, 1)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    md = report.write(results, out)
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in results["runs"] if not r["ok"]]
    not_run = [r for r in results["runs"] if r.get("not_run")]
    progress(f"wrote {out / 'results.json'}, {md} and {len(list(out.glob('*.png')))} plot(s) in "
             f"{results['wall_s']:.0f} s" + (f"; {len(failed)} process(es) FAILED (see the notes)" if failed else "")
             + (f"; {len(not_run)} process(es) not run (see the report)" if not_run else ""))
    return 1 if failed else 0


def default_timeout(suite: str, est: float) -> float:
    """Seconds a process may run: a hung GPU process costs a few times its
    estimate, not the session (the cpu suite, on CI machines of any speed: 300)."""
    return 300.0 if suite == "cpu" else min(300.0, max(90.0, 4 * est))


def _process(g, rep: int, suite: str, work: Path, timeout: float,
             servers: dict | None = None) -> tuple[dict | None, str | None]:
    """Runs one process of group g: (its sections, None) or (None, why it failed). servers: the
    run's Redis server, started here for the first row seeded from another's winners."""
    path = work / f"{g.name}-{rep}.json"
    path.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LAZYTRITON_BENCH_WORK": str(work),
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "JAX_ENABLE_COMPILATION_CACHE": "false"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    # XLA's settings are the harness's: JAX rows run with XLA's defaults unless their group sets
    # XLA_FLAGS (command buffers on / off), whatever the calling shell (or pytest's conftest) set.
    env.pop("XLA_FLAGS", None)
    # The rows measure this run's caches: never a fleet's server the calling shell may name.
    env.pop("LAZYTRITON_REMOTE_CACHE", None)
    # Cold rows: fresh caches per repetition (warm rows reuse the cold row's);
    # the other groups share the run's caches (their first process compiles).
    base = work / f"rep{rep}" / g.fresh_cache if g.fresh_cache else work
    env.update(LAZYTRITON_CACHE_DIR=str(base / "lazytriton-cache"), TRITON_CACHE_DIR=str(base / "triton-cache"))
    env.update(g.env)
    if g.seeded_from:
        try:
            server = servers.get("redis") if servers is not None else None
            if server is None:
                server = redis_server.RedisServer(work / "redis").start()
                if servers is not None:
                    servers["redis"] = server
            redis_server.seed(server, work / f"rep{rep}" / g.seeded_from / "lazytriton-cache")
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            return None, f"could not seed the run's Redis server with the winners of {g.seeded_from}: {exc}"
        env["LAZYTRITON_REMOTE_CACHE"] = server.url
    if g.script:
        argv = [sys.executable, "-c", g.script, str(path)]
    else:
        argv = [sys.executable, "-m", "lazytriton.bench", "--worker", g.name, "--suite", suite, "--json", str(path)]
    tail: collections.deque = collections.deque(maxlen=30)
    proc = subprocess.Popen(argv, env=env, cwd=str(work), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)

    def echo():
        for line in proc.stdout:
            tail.append(line.rstrip())
            print(f"    {line.rstrip()}", file=sys.stderr, flush=True)

    reader = threading.Thread(target=echo, daemon=True)
    reader.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the process and what it started (compile workers)
        proc.wait()
        reader.join(5)
        return None, f"timed out after {timeout:.0f} s; last output: {' | '.join(list(tail)[-5:])}"
    reader.join(5)
    if rc != 0 or not path.exists():
        return None, f"exit {rc}; last output: {' | '.join(list(tail)[-8:])}"
    raw = json.loads(path.read_text())
    path.unlink()
    if g.script:
        from . import cold, online

        if g.name in online.GROUPS:
            return online.sections(g.name, raw), None
        return {"first_call": cold.section([cold.to_row(g.name, raw)], [])}, None
    return raw["sections"], None


def _worker(group: str, suite: str, path: str) -> int:
    """One group's process: measures, writes {"sections": ...} to path."""
    from . import cpu, distributed, field, jax_group, throughput_group, torch_group

    run_group = {
        "torch": lambda: torch_group.run(progress, suite),
        "throughput": lambda: throughput_group.run(progress, suite),
        "jax-cb-on": lambda: jax_group.run(progress, suite, True),
        "jax-cb-off": lambda: jax_group.run(progress, suite, False),
        "distributed": lambda: distributed.run(progress, suite),
        "field": lambda: field.run(progress, suite),
        "cpu": lambda: {"sections": {"cpu": cpu.run(progress, suite)}},
    }.get(group)
    if run_group is None:
        print(f"lazytriton bench: no group {group!r}", file=sys.stderr)
        return 2
    Path(path).write_text(json.dumps(run_group()))
    return 0


# -- merging processes ---------------------------------------------------------------------

_SECTION_META = ("title", "unit", "better", "ratio_to")


def merge(outputs: list[dict]) -> dict:
    """Sections of every process merged: rows by system name, in the order first
    seen; samples pooled ("samples"), kept per process ("process_samples"),
    with each process's other fields ("per_process"); a section's other fields
    kept per process ("<field>_per_process"); failures as notes of the sections
    the group was to fill."""
    merged: dict[str, dict] = {}
    for o in outputs:
        if o.get("error") or o.get("not_run"):
            for name in o.get("planned", []):
                sec = merged.setdefault(name, {"rows": {}, "notes": []})
                sec["notes"].append(f"{o['group']}, process {o['rep'] + 1}: "
                                    + (f"FAILED ({o['error']})" if o.get("error") else o["not_run"]))
            continue
        for name, s in (o.get("sections") or {}).items():
            sec = merged.setdefault(name, {"rows": {}, "notes": []})
            for k in _SECTION_META:
                if k in s:
                    sec.setdefault(k, s[k])
            for k, v in s.items():
                if k not in (*_SECTION_META, "rows", "notes"):
                    sec.setdefault(k, v)
                    sec.setdefault(f"{k}_per_process", []).append(v)
            for note in s.get("notes", []):
                if note not in sec["notes"]:
                    sec["notes"].append(note)
            for r in s.get("rows", []):
                m = sec["rows"].get(r["system"])
                own = {k: v for k, v in r.items() if k not in ("system", "kind", "samples")}
                if m is None:
                    m = sec["rows"][r["system"]] = {**own, "system": r["system"], "kind": r["kind"], "samples": [],
                                                    "process_samples": [], "per_process": []}
                    m.pop("rate", None)
                m["samples"] += r["samples"]
                m["process_samples"].append(r["samples"])
                m["per_process"].append(own)
                if "rate" in r:
                    m.setdefault("rate", []).extend(r["rate"])
                if "correct" in r:
                    m["correct"] = bool(m.get("correct", True) and r["correct"])
    order = {n: i for i, n in enumerate(plan.SECTION_ORDER)}
    return {name: {"title": name, **sec, "rows": list(sec["rows"].values())}
            for name, sec in sorted(merged.items(), key=lambda kv: order.get(kv[0], len(order)))}


# -- environment -----------------------------------------------------------------------------


def _command() -> str:
    if sys.argv[1:2] == ["bench"]:
        return " ".join(["lazytriton", *sys.argv[1:]])
    if sys.argv and sys.argv[0].endswith(("lazytriton/bench/__main__.py", "bench/__main__.py")):
        return " ".join(["python -m lazytriton.bench", *sys.argv[1:]])
    return " ".join(sys.argv)


def _version(*dists: str) -> str | None:
    from importlib import metadata

    for d in dists:
        try:
            return metadata.version(d)
        except metadata.PackageNotFoundError:
            continue
    return None


def _environment() -> dict:
    import lazytriton

    env = {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
           "lazytriton": lazytriton.__version__}
    if os.environ.get("XLA_FLAGS"):
        env["XLA_FLAGS (not passed on)"] = os.environ["XLA_FLAGS"]
    for name, dists in (("triton", ("triton",)), ("jax", ("jax",)), ("jaxlib", ("jaxlib",)), ("torch", ("torch",)),
                        ("cupy", ("cupy-cuda13x", "cupy-cuda12x", "cupy")), ("jax-triton", ("jax-triton",))):
        v = _version(*dists)
        if v:
            env[name] = v
    gpus, _ = _gpus()
    if gpus:
        from lazytriton import _core

        dev = _core.device_info(0)
        env.update(device=dev["name"], gpus=gpus, capability=list(dev["capability"]), driver=dev["driver_version"])
    return env


# -- the benchmarks/ scripts ---------------------------------------------------------------------


def script_main(sections: list[str], argv: list[str] | None = None, description: str | None = None,
                workloads: str | None = None) -> int:
    """What a benchmarks/ script runs: the harness's sections `sections`
    (full suite, 3 processes by default; only `workloads`, see --workloads),
    their tables printed on stdout."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--suite", choices=("quick", "full"), default="full")
    p.add_argument("--processes", type=int, default=None)
    p.add_argument("--out", default=None, help="keep results.json, report.md and plots here (default: a temporary "
                                               "directory)")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory(prefix="lazytriton-bench-") as tmp:
        out = a.out or tmp
        args = [f"--suite={a.suite}", f"--out={out}", f"--only={','.join(sections)}",
                *([f"--processes={a.processes}"] if a.processes else []), *(["--dry-run"] if a.dry_run else []),
                *([f"--workloads={workloads}"] if workloads else [])]
        rc = main(args)
        md = Path(out) / "report.md"
        if not a.dry_run and md.exists():
            print(md.read_text())
    return rc
