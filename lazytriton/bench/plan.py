"""What a suite runs: process groups, the sections and rows each contributes,
what each needs, and how long each is expected to take (for --dry-run and the
progress lines; the estimates are for an H100/H200 host with 16 cores).

A group is one kind of process. The runner starts every group once per
repetition (--processes N), repetitions one after another and groups in this
order within each, so that drift over the run hits every system alike; inside
a process, rows are interleaved round by round (timing.interleaved)."""
from __future__ import annotations

from dataclasses import dataclass, field

from . import cold, cpu, distributed, field as field_group, jax_group, online, redis_server, throughput_group, \
    torch_group

SUITES = ("cpu", "quick", "full")
# Cold rows run once whatever --processes says: a build of the FFI handler (g++) per repetition costs more
# than its spread tells, and jax-triton's cold first call (its serial compile of every config at lowering,
# 6-7 s on an H100 host, 2026-11-24) is the baseline of a ratio far from its goal; the cold row with a gap
# between wrapping and calling says where the compile server's start-up went.
# The row warm from Redis too: its empty cache builds the launch stub and the torch reader after its call.
ONCE = {"cold-jax-runtime-handler", "cold-jax-triton", "cold-lazy-gap", "warm-redis", "warm-redis-gap", "warm-lazy-gap"}
SECTION_ORDER = ("launch", "small", "chain", "throughput", "jax_throughput", "tuning", "first_call", "online",
                 "distributed", "field", "field_program", "cpu")


@dataclass
class Group:
    name: str
    title: str
    rows: dict                       # {section: [row names]} it contributes (planned; some may turn out absent)
    needs: tuple = ()                # modules that must be importable
    est_s: tuple = (10.0, 10.0)      # seconds: its first process, each later one
    script: str | None = None        # cold/warm rows: the code run with `python -c`
    env: dict = field(default_factory=dict)
    fresh_cache: str | None = None   # cold/warm rows: the group whose fresh per-repetition caches it uses
    once: bool = False               # runs in one process whatever --processes says
    seeded_from: str | None = None   # cold/warm rows: the group whose winners the run's Redis holds (cold.SEEDED_FROM)
    notes: list = field(default_factory=list)

    @property
    def sections(self) -> list[str]:
        return list(self.rows)


def build(suite: str, gpus: int, importable=cold.importable, only: set | None = None) -> tuple[list[Group], list[str]]:
    """(groups of the suite that can run here, notes on what is skipped and why);
    `only`: the sections asked for (--only), None for all."""
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r} (one of {', '.join(SUITES)})")
    full = suite == "full"
    cpu_group = Group("cpu", "without a GPU: lowering, compile per config (sm_90), stub build",
                      {"cpu": cpu.row_names(suite)}, needs=("triton",), est_s=(15.0 if suite != "quick" else 10.0,) * 2,
                      once=True)
    if suite == "cpu":
        return [cpu_group], []
    q = (lambda a, b: b) if full else (lambda a, b: a)  # noqa: E731  (quick, full)
    groups = [
        Group("torch", "launch cost (Python paths, C++ program, floors) and launch-bound sizes",
              {"launch": torch_group.launch_rows(suite),
               **({"small": torch_group.small_rows(suite)} if full else {})},
              needs=("torch",), est_s=(q(16, 28), q(7, 15))),
        Group("throughput", "tuned workloads: kernel time, rate vs the device's ceilings, tuning quality",
              {"throughput": throughput_group.throughput_rows(suite), "tuning": throughput_group.tuning_rows(suite)},
              needs=("torch",), est_s=(q(25, 28), q(12, 18))),
        Group("jax-cb-on", "JAX, command buffers on: 32-kernel chain and tuned workloads",
              {"chain": [r for r, _, _ in jax_group.chain_rows(True)],
               "jax_throughput": jax_group.throughput_rows(suite)},
              needs=("jax",), est_s=(q(25, 35), q(12, 32)), env={"XLA_FLAGS": jax_group.CB_ON}),
        Group("jax-cb-off", "JAX, command buffers off: 32-kernel chain",
              {"chain": [r for r, _, _ in jax_group.chain_rows(False)]},
              needs=("jax",), est_s=(q(12, 10), q(8, 8)), env={"XLA_FLAGS": jax_group.CB_OFF}),
    ]
    # Full-suite figures: what each process took on an H100 host with 16 cores (2026-11-24).
    est = {"cold-triton": 11, "cold-lazy": 7, "warm-lazy": 6, "cold-lazy-gap": 9, "cold-jax": 13, "warm-jax": 12,
           "cold-jax-runtime-handler": 15, "cold-jax-triton": 18,
           "warm-lazy-gap": 7,
           # estimates: their empty caches build the launch stub and the torch reader afterwards
           "warm-redis": 25, "warm-redis-gap": 26}
    notes = []
    for name, row, _, script, env, shared, suites, need in cold.ROWS:
        if suite in suites:
            seeded = cold.SEEDED_FROM.get(name)
            beside_redis = seeded or name in cold.WITH_REDIS
            if beside_redis and redis_server.available() is None:
                notes.append(f"first call: {row}: skipped (redis-server is not installed: apt-get install redis-server)")
                continue
            if beside_redis and "first_call" not in (only or ()):  # the suites' budgets have no room for it
                notes.append(f"first call: {row}: with --only first_call")
                continue
            groups.append(Group(name, f"first call: {row}", {"first_call": [row]},
                                needs=(need, "redis") if seeded else (need,), est_s=(est[name], est[name]),
                                script=script, env=env, fresh_cache=shared or name, once=name in ONCE,
                                seeded_from=seeded))
    # Online tuning (issue 48): each row a fresh process with caches of its own; the demo matmul's
    # online first call is a row of the first-call section too. Only when asked for by name (about
    # 80 s: the suites' budgets have no room for it).
    with_online = "online" in (only or ())
    if not with_online:
        notes.append("online tuning (first call, calls until the winner is fixed, the winner): with --only=online")
    for name, title, env, est_s in online.groups(suite) if with_online else ():
        rows = {"online": [online.row_name(name)]}
        if online.GROUPS[name] == ("demo", "online"):
            rows["first_call"] = ["lazytriton, cold, online tuning (first call: one compile, no trials)"]
        groups.append(Group(name, f"online tuning: {title}", rows, needs=("torch",), est_s=(est_s, est_s),
                            script=online.SCRIPT, env=env, fresh_cache=name))
    # Its ranks share the GPUs (on one, every rank shares it): there only when asked for by name,
    # to keep the full suite inside its budget.
    with_distributed = full and (gpus >= 2 or "distributed" in (only or ()))
    if with_distributed:
        groups.append(Group("distributed", "jax.distributed first step, 2 and 4 ranks",
                            {"distributed": list(distributed.ROWS)}, needs=("jax",), est_s=(200.0, 200.0),
                            once=True))
    # Kernels of a heavy package and a 16-kernel program, every row a fresh process that imports torch
    # and jax (seconds each): only when asked for by name, as the distributed group on one GPU.
    with_field = bool({"field", "field_program"} & set(only or ()))
    if with_field:
        groups.append(Group("field", "kernels of a package that imports torch and jax; a 16-kernel program",
                            {"field": list(field_group.ONE_ROWS), "field_program": list(field_group.PROGRAM_ROWS)},
                            needs=("torch", "jax"), est_s=(q(170, 280), q(170, 280)), once=True))
    groups.append(cpu_group)
    if not with_field:
        notes.append("kernels of a heavy package, 16-kernel program: with --only=field (benchmarks/cold_field.py)")
    if full and not with_distributed:
        notes.append("distributed first step: in the full suite with 2 GPUs or more; on one GPU with "
                     "--only=distributed (benchmarks/distributed_first_step.py)")
    kept = []
    for g in groups:
        missing = [m for m in g.needs if not importable(m)]
        if missing:
            notes.append(f"{g.title}: skipped ({', '.join(missing)} not importable)")
        else:
            kept.append(g)
    return kept, notes


def processes_of(g: Group, n: int) -> int:
    return 1 if g.once else n


REPORT_S = 10.0  # the runner's start, report.md and the plots


def estimate_s(groups: list[Group], n: int) -> float:
    return REPORT_S + sum(g.est_s[0] + (processes_of(g, n) - 1) * g.est_s[1] for g in groups)


def schedule(groups: list[Group], n: int) -> list[tuple[Group, int]]:
    """(group, repetition) in run order: repetitions one after another, every
    group once in each (a group that runs once: in the first)."""
    return [(g, rep) for rep in range(n) for g in groups if rep < processes_of(g, n)]


def summary(suite: str, groups: list[Group], notes: list[str], n: int) -> str:
    """The --dry-run listing: every process, the rows per section, the estimate."""
    lines = [f"lazytriton bench --suite {suite}: {len(schedule(groups, n))} processes "
             f"({n} repetition(s)), about {estimate_s(groups, n) / 60:.1f} min by estimate", ""]
    for g in groups:
        k = processes_of(g, n)
        lines.append(f"group {g.name}: {g.title} — {k} process(es), ~{g.est_s[0]:.0f} s"
                     + (f" + {k - 1} x ~{g.est_s[1]:.0f} s" if k > 1 else ""))
        if g.env:
            lines.append("  env: " + " ".join(f"{k_}={v}" for k_, v in g.env.items()))
        for sec, rows in g.rows.items():
            lines.append(f"  section {sec}:")
            lines += [f"    - {r}" for r in rows]
    if notes:
        lines += ["", "skipped:"] + [f"  - {n_}" for n_ in notes]
    return "\n".join(lines)

