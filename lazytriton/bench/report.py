"""report.md and PNG plots from a results dict (results.json)."""
from __future__ import annotations

import statistics
from pathlib import Path

from .timing import summary


def _process_range(row: dict) -> str:
    per = row.get("process_samples")
    if not per or len(per) < 2:
        return ""
    meds = [statistics.median(p) for p in per if p]
    return f"{min(meds):.3g}-{max(meds):.3g}"


def _median_process(row: dict) -> float:
    per = row.get("process_samples") or [row["samples"]]
    meds = sorted(statistics.median(p) for p in per if p)
    return meds[len(meds) // 2] if meds else float("nan")


def write(results: dict, out: Path) -> Path:
    env = results["environment"]
    lines = [f"# lazytriton bench: {results['suite']} suite", "",
             f"`{results['command']}` — {results['started']} to {results.get('finished', '?')}", "",
             "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in env.items()]
    plots = _plots(results, out)
    for name, sec in results["sections"].items():
        lines += ["", f"## {sec['title']}", ""]
        if name == "throughput":
            lines += _throughput_table(sec)
        else:
            lines += _plain_table(sec)
        lines += [f"- {n}" for n in sec.get("notes", [])]
        if name in plots:
            lines += ["", f"![{sec['title']}]({plots[name]})"]
        if name == "throughput" and sec.get("tuning"):
            lines += ["", "### Tuning quality: the config lazytriton chose vs the exhaustive best", "",
                      "| workload | chosen | best | chosen/best |", "| --- | --- | --- | --- |"]
            for t in sec["tuning"]:
                ratio = f"{t['ratio']:.3f}" if t["ratio"] is not None else "?"
                ch = t["chosen"]
                lines.append(f"| {t['workload']} | {ch} ({t['times_us'][ch]:.1f} us) | {t['best']} "
                             f"({t['times_us'][t['best']]:.1f} us) | {ratio} |" if ch is not None else
                             f"| {t['workload']} | ? | {t['best']} | ? |")
            if "tuning" in plots:
                lines += ["", f"![tuning]({plots['tuning']})"]
    md = out / "report.md"
    md.write_text("\n".join(lines) + "\n")
    return md


def _plain_table(sec: dict) -> list[str]:
    base_name = sec.get("ratio_to")
    base = next((_median_process(r) for r in sec["rows"] if r["system"] == base_name), None)
    lines = [f"| system | median {sec['unit']} | p10-p90 | median per process | vs floor |",
             "| --- | --- | --- | --- | --- |"]
    for r in sec["rows"]:
        s = summary(r["samples"])
        med = _median_process(r)
        ratio = f"{med / base:.2f}x" if base else ""
        name = f"{r['system']} (floor)" if r["kind"] == "floor" else r["system"]
        lines.append(f"| {name} | {med:.3g} | {s['p10']:.3g}-{s['p90']:.3g} | {_process_range(r)} | {ratio} |")
    return lines


def _throughput_table(sec: dict) -> list[str]:
    c = sec.get("ceilings", {})
    lines = [f"Ceilings measured in this run: copy {c.get('copy_GBps', float('nan')):.0f} GB/s, fp16 matmul "
             f"{c.get('matmul_TFLOPs', float('nan')):.0f} TFLOP/s.", "",
             "| workload | system | median us | rate | of ceiling | first call | correct |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in sec["rows"]:
        rate = statistics.median(r["rate"])
        first = f"{r['first_call_s']:.2f} s" if "first_call_s" in r else ""
        correct = {True: "yes", False: "**NO**"}.get(r.get("correct"), "")
        lines.append(f"| {r['workload']} | {r['system'].split(': ', 1)[1]} | {_median_process(r):.1f} | "
                     f"{rate:.0f} {r['rate_unit']} | {rate / r['ceiling']:.0%} | {first} | {correct} |")
    return lines


def _plots(results: dict, out: Path) -> dict:
    """PNG files by section name (none when matplotlib is missing)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return {}
    made = {}
    colors = {"lazytriton": "#1f77b4", "other": "#ff7f0e", "floor": "#999999"}
    for name, sec in results["sections"].items():
        rows = sec["rows"]
        if name == "throughput":
            fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
            vals = [statistics.median(r["rate"]) / r["ceiling"] * 100 for r in rows]
            ax.barh(range(len(rows)), vals, color=[colors[r["kind"]] for r in rows])
            ax.set_yticks(range(len(rows)), [r["system"] for r in rows], fontsize=7)
            ax.set_xlabel("% of the device's measured ceiling (copy bandwidth or fp16 matmul rate)")
            ax.axvline(100, color="k", lw=0.8)
        else:
            fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
            meds = [_median_process(r) for r in rows]
            lo = [m - summary(r["samples"])["p10"] for m, r in zip(meds, rows)]
            hi = [summary(r["samples"])["p90"] - m for m, r in zip(meds, rows)]
            ax.barh(range(len(rows)), meds, xerr=[lo, hi], color=[colors[r["kind"]] for r in rows])
            ax.set_yticks(range(len(rows)), [r["system"] for r in rows], fontsize=7)
            ax.set_xlabel(sec["unit"] + " (gray: floors; bars: median, whiskers: 10th-90th percentile)")
            for r, m in zip(rows, meds):
                if r["kind"] == "floor":
                    ax.axvline(m, color=colors["floor"], ls="--", lw=0.8)
        ax.invert_yaxis()
        ax.set_title(sec["title"], fontsize=9)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made[name] = path.name
        if name == "throughput" and sec.get("tuning"):
            tun = sec["tuning"]
            fig, axes = plt.subplots(len(tun), 1, figsize=(8, 1.6 * len(tun) + 0.5), squeeze=False)
            for ax, t in zip(axes[:, 0], tun):
                cs = ["#2ca02c" if i == t["chosen"] else "#bbbbbb" for i in range(len(t["times_us"]))]
                ax.bar(range(len(t["times_us"])), t["times_us"], color=cs)
                ax.set_title(f"{t['workload']} (green: chosen)", fontsize=8)
                ax.set_ylabel("us", fontsize=7)
            fig.tight_layout()
            fig.savefig(out / "tuning.png", dpi=110)
            plt.close(fig)
            made["tuning"] = "tuning.png"
    return made
