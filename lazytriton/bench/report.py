"""report.md and PNG plots from a results dict (results.json): tables with
medians, spread and ratios to the floors; bar charts of per-launch host cost
and per-kernel chain cost with the floors drawn in; first-call timelines cold
vs warm; kernel time per config with the chosen one marked; throughput against
the device's measured ceilings (a roofline)."""
from __future__ import annotations

import math
import statistics
from pathlib import Path

from .timing import summary

COLORS = {"lazytriton": "#1f77b4", "other": "#ff7f0e", "floor": "#8c8c8c"}


# -- numbers -----------------------------------------------------------------------------------


def median_process(row: dict) -> float:
    """The median over processes of each process's median (one process: its median)."""
    per = [p for p in (row.get("process_samples") or [row.get("samples") or []]) if p]
    meds = sorted(statistics.median(p) for p in per)
    if not meds:
        return float("nan")
    return statistics.median(meds)


def process_range(row: dict) -> str:
    per = [p for p in (row.get("process_samples") or []) if p]
    if len(per) < 2:
        return ""
    meds = [statistics.median(p) for p in per]
    return f"{_g(min(meds))}-{_g(max(meds))}"


def _g(v: float) -> str:
    """Three significant digits in plain notation (1590, 12.3, 0.0123): never 1.59e+03."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "?"
    if v == 0:
        return "0"
    return f"{v:.{max(0, 2 - math.floor(math.log10(abs(v))))}f}"


def ceilings(results: dict) -> dict:
    """Copy bandwidth and matmul rate: the median over the throughput processes."""
    per = (results["sections"].get("throughput") or {}).get("ceilings_per_process") or []
    if not per:
        c = (results["sections"].get("throughput") or {}).get("ceilings")
        per = [c] if c else []
    if not per:
        return {}
    return {k: statistics.median(p[k] for p in per) for k in per[0]}


def _rate(r: dict) -> float:
    return statistics.median(r["rate"]) if r.get("rate") else float("nan")


# -- report.md ---------------------------------------------------------------------------------


def write(results: dict, out: Path) -> Path:
    out = Path(out)
    env = results.get("environment", {})
    took = f", {results['wall_s']:.0f} s" if results.get("wall_s") else ""
    lines = [f"# lazytriton bench: {results.get('suite', '?')} suite", "",
             f"`{results.get('command', '?')}` — {results.get('started', '?')} to "
             f"{results.get('finished', '(cut short)')}{took}", "",
             f"Every figure: the median over {results.get('processes_per_group', '?')} process(es) per group of each "
             "process's median; p10-p90 over all samples; rows measured side by side, interleaved round by round "
             "within a process, processes round-robin across groups.", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    if results.get("skipped"):
        lines += ["", "Skipped:"] + [f"- {s}" for s in results["skipped"]]
    failed = [r for r in results.get("runs", []) if not r.get("ok", True)]
    if failed:
        lines += ["", "**Failed processes:**"] + [f"- {r['group']} (process {r['rep'] + 1}): {r.get('error', '')}"
                                                   for r in failed]
    not_run = [r for r in results.get("runs", []) if r.get("not_run")]
    if not_run:
        lines += ["", "**Processes not run:**"] + [f"- {r['group']} (process {r['rep'] + 1}): {r['not_run']}"
                                                    for r in not_run]
    plots = _plots(results, out)
    ceil = ceilings(results)
    for name, sec in results.get("sections", {}).items():
        lines += ["", f"## {sec.get('title', name)}", ""]
        if not sec.get("rows"):
            lines += ["No row measured (the notes say why)."]
        elif name in ("throughput", "jax_throughput"):
            lines += _throughput_table(sec, ceil)
        elif name == "tuning":
            lines += _tuning_table(sec)
        elif name == "first_call":
            lines += _first_call_table(sec)
        elif name == "online":
            from . import online

            lines += _table(online.HEADER, online.table(sec, median_process))
        else:
            lines += _plain_table(sec)
        lines += [""] + [f"- {n}" for n in sec.get("notes", [])]
        for plot in plots.get(name, []):
            lines += ["", f"![{sec.get('title', name)}]({plot})"]
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table without the columns no row fills (a run of one process has no
    per-process range, a section without a floor no ratio, rows without notes no notes)."""
    keep = [j for j in range(len(header)) if j == 0 or any(str(r[j]).strip() for r in rows)]
    lines = ["| " + " | ".join(header[j] for j in keep) + " |", "| " + " | ".join("---" for _ in keep) + " |"]
    return lines + ["| " + " | ".join(str(r[j]) for j in keep) + " |" for r in rows]


def _flags(r: dict) -> str:
    bits = []
    if r.get("correct") is False:
        bits.append("**WRONG RESULT**")
    if r.get("handler_runs_per_kernel") is not None:
        bits.append(f"handler runs/kernel {r['handler_runs_per_kernel']:.3f}")
    if r.get("op"):
        bits.append(r["op"])
    if r.get("error"):
        bits.append("failed")
    return ", ".join(bits)


def _plain_table(sec: dict) -> list[str]:
    rows = sec.get("rows", [])
    base_name = sec.get("ratio_to")
    base = next((median_process(r) for r in rows if r["system"] == base_name), None)
    unit = sec.get("unit", "")
    out = []
    for r in rows:
        s, med = summary(r["samples"]), median_process(r)
        ratio = f"{med / base:.2f}x" if base and math.isfinite(med) else ""
        name = f"{r['system']} (floor)" if r["kind"] == "floor" else r["system"]
        out.append([name, _g(med), f"{_g(s['p10'])}-{_g(s['p90'])}", process_range(r), ratio, _flags(r)])
    return _table(["system", f"median {unit}", "p10-p90", "per-process medians", f"vs {base_name or 'floor'}",
                   "notes"], out)


def _throughput_table(sec: dict, ceil: dict) -> list[str]:
    lines = []
    if ceil:
        lines += [f"Ceilings measured in this run: copy {ceil.get('copy_GBps', float('nan')):.0f} GB/s, fp16 matmul "
                  f"{ceil.get('matmul_TFLOPs', float('nan')):.0f} TFLOP/s.", ""]
    out = []
    for r in sec.get("rows", []):
        s = summary(r["samples"])
        rate = _rate(r)
        c = _ceiling(r, ceil)
        of = f"{rate / c:.0%}" if c and math.isfinite(rate) else ""
        system = r["system"].split(": ", 1)[1] if ": " in r["system"] else r["system"]
        out.append([r.get("workload", ""), system, _g(median_process(r)), f"{_g(s['p10'])}-{_g(s['p90'])}",
                    f"{rate:.0f} {r.get('rate_unit', '')}", of, _flags(r)])
    return lines + _table(["workload", "system", "median us", "p10-p90", "rate", "of ceiling", "notes"], out)


def _ceiling(r: dict, ceil: dict) -> float | None:
    if not ceil:
        return r.get("ceiling")
    return ceil.get("matmul_TFLOPs") if r.get("bound") == "compute" else ceil.get("copy_GBps")


def tuning_summary(r: dict) -> dict:
    """Per-config kernel time (median over processes), chosen config(s), best, ratio."""
    per = r.get("per_process") or [r]
    n = len(per[0]["times_us"])
    times = [statistics.median(p["times_us"][i] for p in per) for i in range(n)]
    chosen = [p["chosen"] for p in per]
    finite = [i for i in range(n) if math.isfinite(times[i])]
    best = min(finite, key=lambda i: times[i]) if finite else None
    ratios = [p["ratio"] for p in per if p.get("ratio") is not None and math.isfinite(p["ratio"])]
    return {"times": times, "chosen": chosen, "best": best, "ratio": statistics.median(ratios) if ratios else None,
            "configs": r.get("configs") or per[0].get("configs") or [str(i) for i in range(n)]}


def _tuning_table(sec: dict) -> list[str]:
    out = []
    for r in sec.get("rows", []):
        t = tuning_summary(r)
        chosen = ", ".join(f"{c} ({t['times'][c]:.1f} us)" for c in t["chosen"])
        best = f"{t['best']} ({t['times'][t['best']]:.1f} us)" if t["best"] is not None else "?"
        ratio = f"{t['ratio']:.3f}" if t["ratio"] is not None else "?"
        out.append([r["system"], chosen, best, ratio, _g(median_process(r))])
    return _table(["workload", "chosen (per process)", "best", "chosen/best (median)", "time to choose (median ms)"],
                  out)


def _first_call_table(sec: dict) -> list[str]:
    rows = sec.get("rows", [])
    base = next((median_process(r) for r in rows if r["system"] == sec.get("ratio_to")), None)
    out = []
    for r in rows:
        med = median_process(r)
        ratio = f"{base / med:.2f}x faster" if base and med and r["system"] != sec.get("ratio_to") else ""
        split = _median_split(r)
        parts = [f"{k.removesuffix('_s').replace('_', ' ')} {v * 1e3:.0f} ms" for k, v in split.items()
                 if k not in ("imports_s", "backend_s")]
        before = [f"{k.removesuffix('_s')} {v:.2f} s" for k, v in split.items() if k in ("imports_s", "backend_s")]
        extra = []
        st = r.get("stats")
        if st:
            extra.append(f"compiles {st.get('compiles')}, tunes {st.get('tunes')}, cache hits {st.get('record_hits')}")
        if before:
            extra.append("before the clock: " + ", ".join(before))
        out.append([r["system"], _g(med), process_range(r), ratio, "; ".join(parts),
                    "; ".join(extra + ([_flags(r)] if _flags(r) else []))])
    return _table(["system", "first call (median s)", "per-process", "vs Triton's autotuner", "split (median)",
                   "notes"], out)


def _median_split(r: dict) -> dict:
    per = [p.get("split") or {} for p in (r.get("per_process") or [r])]
    keys = [k for k in (per[0] if per else {})]
    return {k: statistics.median(p[k] for p in per if k in p) for k in keys}


# -- plots -----------------------------------------------------------------------------------


def _plots(results: dict, out: Path) -> dict:
    """{section: [PNG file names]} (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401  (present, not only matplotlib)
    except ImportError:
        return {}
    made: dict[str, list[str]] = {}
    secs = results.get("sections", {})
    for name, sec in secs.items():
        if not sec.get("rows"):
            continue
        if name in ("launch", "chain", "cpu", "distributed", "field", "field_program"):
            f = _bars(sec, out / f"{name}.png")
        elif name == "small":
            f = _grouped(sec, out / "small.png")
        elif name == "tuning":
            f = _tuning_plot(sec, out / "tuning.png")
        elif name == "first_call":
            f = _timeline(sec, out / "first_call.png")
        elif name == "throughput":
            f = _throughput_plot(results, out / "throughput.png")
        else:
            continue
        if f:
            made.setdefault(name, []).append(f)
    if "throughput" in secs or "jax_throughput" in secs:
        f = _roofline(results, out / "roofline.png")
        if f:
            made.setdefault("throughput" if "throughput" in secs else "jax_throughput", []).append(f)
    return made


def _save(fig, path: Path) -> str:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    # "tight": the saved image takes in every label (long system names left of the axes,
    # legends and value labels beside them), which tight_layout alone may cut at the edges.
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path.name


def _bars(sec: dict, path: Path) -> str:
    return _save(bars_figure(sec), path)


def bars_figure(sec: dict):
    """Horizontal bars (median, whiskers p10-p90) with the floors drawn as dashed lines."""
    import matplotlib.pyplot as plt

    rows = sec["rows"]
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(rows) + 1.6))
    meds = [median_process(r) for r in rows]
    lo = [max(0.0, m - summary(r["samples"])["p10"]) if math.isfinite(m) else 0 for m, r in zip(meds, rows)]
    hi = [max(0.0, summary(r["samples"])["p90"] - m) if math.isfinite(m) else 0 for m, r in zip(meds, rows)]
    ax.barh(range(len(rows)), [m if math.isfinite(m) else 0 for m in meds], xerr=[lo, hi],
            color=[COLORS.get(r["kind"], "#555555") for r in rows], error_kw={"lw": 0.8})
    ax.set_yticks(range(len(rows)), [r["system"] for r in rows], fontsize=7)
    floors = [m for r, m in zip(rows, meds) if r["kind"] == "floor" and math.isfinite(m)]
    for m in floors:
        ax.axvline(m, color=COLORS["floor"], ls="--", lw=0.8)
    for i, m in enumerate(meds):
        if math.isfinite(m):  # past the whisker's end, which would strike it through
            ax.text(m + hi[i], i, f" {_g(m)}", va="center", fontsize=6)
    ax.set_xlabel(f"{sec.get('unit', '')}: median; whiskers 10th-90th percentile"
                  + ("; gray and dashed: floors" if floors else ""))
    ax.invert_yaxis()
    ax.set_title(sec.get("title", ""), fontsize=9)
    return fig


def _grouped(sec: dict, path: Path) -> str:
    """Per workload, one bar per system (time per call, back to back)."""
    import matplotlib.pyplot as plt

    rows = sec["rows"]
    workloads = list(dict.fromkeys(r.get("workload", r["system"]) for r in rows))
    systems = list(dict.fromkeys(r["system"].split(": ", 1)[-1] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 0.9 * len(workloads) + 1.6))
    h = 0.8 / max(1, len(systems))
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
    for j, s in enumerate(systems):
        ys, vals = [], []
        for i, w in enumerate(workloads):
            r = next((r for r in rows if r.get("workload", r["system"]) == w and r["system"].endswith(": " + s)), None)
            if r is not None:
                ys.append(i + j * h)
                vals.append(median_process(r))
        ax.barh(ys, vals, height=h, label=s, color=palette[j % len(palette)])
        for y, v in zip(ys, vals):
            ax.text(v, y, f" {_g(v)}", va="center", fontsize=6)
    ax.set_yticks([i + h * (len(systems) - 1) / 2 for i in range(len(workloads))], workloads, fontsize=7)
    ax.invert_yaxis()
    ax.legend(fontsize=7)
    ax.set_xlabel(sec.get("unit", ""))
    ax.set_title(sec.get("title", ""), fontsize=9)
    return _save(fig, path)


def _tuning_plot(sec: dict, path: Path) -> str:
    """Kernel time per config, per workload: the chosen config(s) green, the best outlined."""
    import matplotlib.pyplot as plt

    rows = sec["rows"]
    fig, axes = plt.subplots(len(rows), 1, figsize=(9, 1.7 * len(rows) + 0.6), squeeze=False)
    for ax, r in zip(axes[:, 0], rows):
        t = tuning_summary(r)
        times = [v if math.isfinite(v) else 0 for v in t["times"]]
        colors = ["#2ca02c" if i in t["chosen"] else "#bbbbbb" for i in range(len(times))]
        bars = ax.bar(range(len(times)), times, color=colors)
        if t["best"] is not None:
            bars[t["best"]].set_edgecolor("k")
            bars[t["best"]].set_linewidth(1.5)
        for i, v in enumerate(t["times"]):
            if not math.isfinite(v):
                ax.text(i, 0, "did not run", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_xticks(range(len(times)), [str(i) for i in range(len(times))], fontsize=7)
        ratio = f", chosen/best {t['ratio']:.3f}" if t["ratio"] is not None else ""
        ax.set_title(f"{r['system']} (green: chosen, outlined: fastest{ratio})", fontsize=8)
        ax.set_ylabel("us", fontsize=7)
        finite = [v for v in t["times"] if math.isfinite(v) and v > 0]
        if finite:
            ax.set_ylim(0, max(finite) * 1.15)
    axes[-1, 0].set_xlabel("config index (the kernel's configs, in order)", fontsize=7)
    return _save(fig, path)


LANE_COLORS = {"jit(...).lower()": "#9467bd", "XLA compile": "#8c564b", "first execution": "#e377c2",
               "compile candidates": "#ff7f0e", "compile + tune (overlapped)": "#ffbb78",
               "launch stub build (background)": "#17becf", "bind + cache lookup": "#7f7f7f",
               "compile server start-up (background)": "#393b79",
               "first launch": "#2ca02c", "cached winner: load + launch": "#2ca02c",
               "compile + benchmark every config (serial)": "#d62728"}


def _timeline(sec: dict, path: Path) -> str:
    """One band per system (the median process): its phases on a shared time axis."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    rows = sec["rows"]
    fig, ax = plt.subplots(figsize=(11, 0.75 * len(rows) + 1.8))
    seen = {}
    for i, r in enumerate(rows):
        per = r.get("per_process") or [r]
        samples = r.get("process_samples") or [r["samples"]]
        order = sorted(range(len(per)), key=lambda j: samples[j][0] if samples[j] else 0)
        phases = per[order[len(order) // 2]].get("phases") or []
        lanes = list(dict.fromkeys(p[0] for p in phases))
        h = 0.8 / max(1, len(lanes))
        for lane, start, end in phases:
            k = lanes.index(lane)
            color = LANE_COLORS.get(lane, "#bcbd22" if lane.startswith("FFI handler") else "#aaaaaa")
            ax.barh(i - 0.4 + h * (k + 0.5), max(end - start, 1e-3), left=start, height=h * 0.9, color=color)
            seen.setdefault(lane, color)
        first = median_process(r)
        ax.plot([first, first], [i - 0.45, i + 0.45], color="k", lw=1)
        ax.text(first, i, f" {first:.2f} s", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [r["system"] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds from the data being ready (black: first result, median process)")
    ax.set_title(sec.get("title", ""), fontsize=9)
    # Beside the axes: inside, it hides the end of the longest bars.
    ax.legend(handles=[Patch(color=c, label=lane) for lane, c in seen.items()], fontsize=6, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def _throughput_rows(results: dict) -> list[dict]:
    out = []
    for name in ("throughput", "jax_throughput"):
        for r in (results["sections"].get(name) or {}).get("rows", []):
            out.append({**r, "_from": "torch" if name == "throughput" else "JAX"})
    return out


def _throughput_plot(results: dict, path: Path) -> str | None:
    """% of the ceiling each workload is bound by (copy bandwidth or matmul rate)."""
    import matplotlib.pyplot as plt

    ceil = ceilings(results)
    rows = [r for r in _throughput_rows(results) if _ceiling(r, ceil)]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(rows) + 1.6))
    vals = [_rate(r) / _ceiling(r, ceil) * 100 for r in rows]
    ax.barh(range(len(rows)), [v if math.isfinite(v) else 0 for v in vals],
            color=[COLORS.get(r["kind"], "#555555") for r in rows])
    ax.set_yticks(range(len(rows)), [f"[{r['_from']}] {r['system']}" for r in rows], fontsize=6)
    for i, v in enumerate(vals):
        if math.isfinite(v):
            ax.text(v, i, f" {v:.0f}%", va="center", fontsize=6)
    ax.axvline(100, color="k", lw=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("% of the roof it is bound by: copy bandwidth (memory-bound) or fp16 matmul rate\n"
                  "(compute-bound), measured in this run")
    ax.set_title("Achieved throughput of the tuned workloads", fontsize=9)
    return _save(fig, path)


def _roofline(results: dict, path: Path) -> str | None:
    """Achieved TFLOP/s against arithmetic intensity, under the measured roofs."""
    import matplotlib.pyplot as plt

    ceil = ceilings(results)
    rows = [r for r in _throughput_rows(results) if r.get("flops") and r.get("bytes") and r.get("samples")]
    if not ceil or not rows or not all(math.isfinite(ceil.get(k, float("nan"))) and ceil[k] > 0
                                       for k in ("copy_GBps", "matmul_TFLOPs")):
        return None  # no roofs measured (the throughput process failed before them)
    bw, peak = ceil["copy_GBps"] / 1e3, ceil["matmul_TFLOPs"]  # TB/s, TFLOP/s
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ai = [r["flops"] / r["bytes"] for r in rows]
    xs = [min(ai + [peak / bw]) / 4, max(ai + [peak / bw]) * 4]
    grid = [xs[0] * (xs[1] / xs[0]) ** (i / 200) for i in range(201)]
    ax.plot(grid, [min(peak, bw * x) for x in grid], color="k", lw=1)
    ax.text(xs[0], bw * xs[0] * 1.3, f"copy {bw:.2f} TB/s", fontsize=7)
    ax.text(grid[-1], peak * 1.05, f"fp16 matmul {peak:.0f} TFLOP/s", fontsize=7, ha="right")
    markers = {"lazytriton": "o", "other": "s", "floor": "^"}
    for r, x in zip(rows, ai):
        tflops = r["flops"] / (median_process(r) * 1e-6) / 1e12
        ax.scatter([x], [tflops], marker=markers.get(r["kind"], "x"), color=COLORS.get(r["kind"]),
                   edgecolors="k" if r["_from"] == "JAX" else "none", s=36, zorder=3)
        ax.annotate(f"{r['system']} [{r['_from']}]", (x, tflops), fontsize=5, xytext=(3, -3),
                    textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (flop / byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title("Roofline: blue lazytriton, orange the alternatives; outlined: from JAX (flops as counted in "
                 "workloads.py)", fontsize=8)
    return _save(fig, path)
