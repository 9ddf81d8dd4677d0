"""Online tuning (issue 48): the first call of an 8-config 2048^3 fp16 matmul in online mode
(`lazytriton.kernel(fn, tuning="online")`), the time of each call that follows until the winner
is fixed, and that winner's kernel time against the winner a first call that tunes picks; beside
today's cold first call, Triton's autotuner and the floor it is measured against: the quickest
config to compile alone (the one the online queue puts first without evidence), compiled and
launched once. Two matmuls: the demo's (lazytriton.demo_kernels) and the field package's
(`mm_plain` of bench/field.py's kernels module). Every row is a fresh process with empty
lazytriton and Triton caches.

The online row's process, after its first call: calls until the session settles (at most 60 s:
while the other candidates compile, calls launch the best so far), each on an output poisoned with
NaN and checked against torch's matmul, each timed with a synchronize (per-call times: candidate
kernel, launch, the session's Python); then 30 steady calls; then a
first call that tunes (a cache of its own, same data) and the two winners' kernel times,
interleaved (CUDA events around 20 launches, 10 rounds each). "Extra seconds": the tuning
calls' total over as many steady calls.
"""
from __future__ import annotations

from .cold import PRELUDE
from .common import row
from .field import KERNELS as FIELD_KERNELS

KERNEL_LABELS = {"demo": "demo matmul", "field": "field package's matmul (mm_plain)"}
MODES = {  # LT_ONLINE_MODE -> the row's name after the kernel's label
    "triton": "Triton's @triton.autotune, cold",
    "first_call": "lazytriton, cold, tuned on the first call",
    "online": "lazytriton, cold, online tuning: first call",
    "one": "the quickest config to compile alone: compile + one launch",
}
GROUPS = {f"online-{m}-{k}": (k, m) for k in KERNEL_LABELS for m in MODES}
EST_S = {"triton": 11, "first_call": 8, "online": 14, "one": 6}

SCRIPT = PRELUDE + f"FIELD_KERNELS = {FIELD_KERNELS!r}\n" + r"""
import statistics, tempfile
import torch, triton
KERNEL, MODE = os.environ["LT_ONLINE_KERNEL"], os.environ["LT_ONLINE_MODE"]
M = N = K = 2048
if KERNEL == "field":
    where = tempfile.mkdtemp()
    with open(os.path.join(where, "lt_online_field.py"), "w") as f:
        f.write(FIELD_KERNELS)
    sys.path.insert(0, where)
    import lt_online_field
    tuned = lt_online_field.mm_plain
    def call(k, out):
        k[lambda m: (triton.cdiv(M, m["BM"]) * triton.cdiv(N, m["BN"]),)](a, b, M, N, K, K, 1, N, 1, N, 1, out)
else:
    from lazytriton.demo_kernels import demo_matmul as tuned
    def call(k, out):
        k[lambda m: (triton.cdiv(M, m["BM"]), triton.cdiv(N, m["BN"]))](a, b, out, M, N, K, K, 1, N, 1, N, 1)
if MODE == "triton":
    k = tuned
elif MODE == "one":
    import lazytriton
    from lazytriton.compile import schedule
    one = min(tuned.configs, key=lambda c: schedule.compile_cost(c.kwargs, c.num_warps))
    k = lazytriton.kernel(triton.autotune(configs=[one], key=tuned.keys)(tuned.fn))
else:
    import lazytriton
    k = lazytriton.kernel(tuned, tuning=MODE)
torch.manual_seed(0)
a = torch.randn(M, K, device="cuda", dtype=torch.float16); b = torch.randn(K, N, device="cuda", dtype=torch.float16)
c = torch.full((M, N), float("nan"), device="cuda", dtype=torch.float16)
torch.cuda.synchronize()
t_ready = time.perf_counter()
call(k, c)
torch.cuda.synchronize()
t_first = time.perf_counter()
ref = a.float() @ b.float()
def error(out):
    return (out.float() - ref).abs().max().item()
r = {"imports_s": t_ready - t_start, "first_call_s": t_first - t_ready, "max_err": error(c),
     "ref_max": ref.abs().max().item()}
if MODE != "triton":
    r["stats"] = lazytriton.stats()
def tuning_calls():
    from lazytriton.runtime import online
    calls, errors = [], []
    t_tuning = time.perf_counter()
    while online.counters()["settled"] == 0 and time.perf_counter() - t_tuning < 60:
        c.fill_(float("nan"))  # poisoned: each call's result is one complete launch of a correct candidate
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call(k, c)
        torch.cuda.synchronize()
        calls.append(time.perf_counter() - t0)
        errors.append(error(c))
    settled_s = time.perf_counter() - t_tuning
    steady = []
    for _ in range(30):
        t0 = time.perf_counter()
        call(k, c)
        torch.cuda.synchronize()
        steady.append(time.perf_counter() - t0)
    errors.append(error(c))
    today = lazytriton.kernel(tuned, tuning="first_call", cache=tempfile.mkdtemp())  # today's tuning, same data
    c2 = torch.full_like(c, float("nan"))
    call(today, c2)
    torch.cuda.synchronize()
    errors.append(error(c2))
    def kernel_ms(kk, out, n=20):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            call(kk, out)
        e.record()
        e.synchronize()
        return s.elapsed_time(e) / n
    mine, theirs = [], []
    for _ in range(10):  # interleaved: drift hits both alike
        mine.append(kernel_ms(k, c))
        theirs.append(kernel_ms(today, c2))
    st = statistics.median(steady)
    h = online.history()[-1] if online.history() else {}
    r["online"] = {"calls_s": calls, "settled_after_calls": h.get("calls"), "steady_call_s": st,
                   "settled": online.counters()["settled"] == 1, "tuning_calls_s": settled_s,
                   "extra_s": sum(calls) - len(calls) * st, "winner": k.records[-1].winner_index,
                   "today_winner": today.records[-1].winner_index, "winner_ms": statistics.median(mine),
                   "today_ms": statistics.median(theirs), "max_err_calls": max(errors),
                   "medians_ms": h.get("medians"), "samples": h.get("samples")}
    r["max_err"] = max([r["max_err"]] + errors)
if MODE == "online":
    try:
        tuning_calls()
    except Exception as exc:  # the first call is measured: a row with the error beats no row
        import traceback
        traceback.print_exc()
        r["online_error"] = f"{type(exc).__name__}: {exc}"[:400]
done(r)
"""


def groups(suite: str) -> list[tuple[str, str, dict, float]]:
    """(group name, row title, environment, seconds by estimate) of the processes to run."""
    kernels = ("demo", "field") if suite in ("quick", "full") else ()
    return [(f"online-{m}-{k}", f"{KERNEL_LABELS[k]}: {MODES[m]}", {"LT_ONLINE_KERNEL": k, "LT_ONLINE_MODE": m},
             float(EST_S[m])) for k in kernels for m in MODES]


def row_name(group: str) -> str:
    k, m = GROUPS[group]
    return f"{KERNEL_LABELS[k]}: {MODES[m]}"


def sections(group: str, raw: dict) -> dict:
    """The process's sections: its row of the online section (and, for the demo matmul's online
    first call, a row beside the other first calls of the same matmul)."""
    k, m = GROUPS[group]
    extra = {"max_err": raw.get("max_err"), "split": {"imports_s": raw["imports_s"]}}
    if raw.get("max_err") is not None and raw.get("ref_max") is not None:  # fp16 output of a 2048-long dot
        extra["correct"] = bool(raw["max_err"] <= 2e-2 * raw["ref_max"] + 1e-2)
    if raw.get("stats"):
        extra["stats"] = {s: raw["stats"].get(s) for s in ("compiles", "tunes", "record_hits", "resolves")}
    if raw.get("online"):
        extra["online"] = raw["online"]
    if raw.get("online_error"):
        extra["error"] = raw["online_error"]
    if m == "online":
        extra["phases"] = [["one compile + one launch (online tuning)", 0.0, raw["first_call_s"]]]
    out = {"online": section([row(row_name(group), "other" if m == "triton" else "lazytriton",
                                  [raw["first_call_s"]], **extra)])}
    if (k, m) == ("demo", "online"):
        from . import cold

        out["first_call"] = cold.section([row("lazytriton, cold, online tuning (first call: one compile, no "
                                              "trials)", "lazytriton", [raw["first_call_s"]], **extra)], [])
    return out


def section(rows: list[dict]) -> dict:
    return {"title": "Online tuning (tuning=\"online\"): the first call, the calls until the winner is fixed, the "
                     "winner (8-config 2048^3 fp16 matmuls, fresh processes)",
            "unit": "s", "better": "lower", "rows": rows,
            "notes": ["first call: from the data being ready to the first result (empty lazytriton and Triton "
                      "caches); the quickest config alone: the config the online queue puts first with no evidence "
                      "(compile.schedule.compile_cost), the same machinery, one candidate: its compile and one "
                      "launch; calls until fixed: each synchronized, on an output poisoned with NaN and checked; "
                      "extra s: those calls' total over as many steady calls; winner vs today's: the online winner's "
                      "kernel time over the winner a first call that tunes picks on the same data (CUDA events, "
                      "interleaved)"]}


def table(sec: dict, median_process) -> list[list[str]]:
    """The online section's table rows, one per matmul (report.py renders it)."""
    by = {r["system"]: r for r in sec.get("rows", [])}
    out = []
    for k, label in KERNEL_LABELS.items():
        get = {m: by.get(f"{label}: {name}") for m, name in MODES.items()}
        if not any(get.values()):
            continue
        med = {m: (median_process(r) if r else None) for m, r in get.items()}

        def s(v):
            return f"{v:.3g}" if v is not None else ""

        on = (get["online"] or {}).get("per_process") or [{}]
        info = [p.get("online") for p in on if p.get("online")]
        first = info[0] if info else {}
        ratio = med["online"] / med["one"] if med["online"] and med["one"] else None
        calls = first.get("calls_s") or []
        per_call = ", ".join(f"{t * 1e3:.1f}" for t in calls[:12]) + (" ..." if len(calls) > 12 else "")
        winner = (f"{first['winner_ms'] / first['today_ms'] - 1:+.1%} (config {first['winner']} vs "
                  f"{first['today_winner']})" if first.get("today_ms") else "")
        fixed = (f"{first.get('settled_after_calls')} calls in {first['tuning_calls_s']:.2f} s"
                 if first.get("settled", True) and "tuning_calls_s" in first else
                 f"not fixed after {len(calls)} calls" if "tuning_calls_s" in first else
                 f"{first.get('settled_after_calls')} calls")
        out.append([label, s(med["triton"]), s(med["first_call"]), s(med["online"]), s(med["one"]),
                    f"{ratio:.2f}" if ratio else "",
                    f"{fixed}: {per_call} ms" if calls else "",
                    f"{first['extra_s']:.3f}" if "extra_s" in first else "", winner,
                    "**WRONG RESULT**" if any(r and r.get("correct") is False for r in get.values()) else ""])
    return out


HEADER = ["matmul", "Triton's autotuner, cold (s)", "lazytriton cold, tuned on the first call (s)",
          "online: first call (s)", "quickest config alone: compile + 1 launch (s)", "online first call / that",
          "calls until the winner is fixed (each, ms; first process)", "extra s over those calls",
          "winner's kernel time vs today's winner", "notes"]
