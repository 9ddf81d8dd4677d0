"""Online tuning (lazytriton/runtime/online.py) on the CPU.

The runtime's own path runs in subprocesses (tests/online_worker.py): real Triton compiles for
sm_90, the recording stand-in driver (tests/fake_cuda), whose $FAKE_CUDA_LAUNCH_MS gives each
block size a launch time, so that each config of the worker's kernel has a time of its own
(num_warps 1, 2, 4: 3, 1 and 2 ms unless a test says otherwise) and the launch log says which
config each call launched."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import triton
import triton.language as tl

import lazytriton
from lazytriton import _core, distributed, settings
from lazytriton.cache import Cache, measurements
from lazytriton.cpp import bundle
from lazytriton.runtime import online
from test_distributed import MemoryStore  # a dict with the key-value store's methods

HERE = Path(__file__).resolve().parent
WORKER = HERE / "online_worker.py"
TIMES = "32:3,64:1,128:2"  # block size (threads) -> ms: config 1 (num_warps=2) is the fastest
BLOCK_OF = {0: 32, 1: 64, 2: 128}  # config index -> its block size


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=w) for w in (1, 2, 4)], key=["n"])
@triton.jit
def bump(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)


# -- the setting and the kernel's choice -------------------------------------------------------

@pytest.mark.parametrize("raw, mode", [(None, "first_call"), ("1", "first_call"), ("first_call", "first_call"),
                                       ("online", "online"), ("ONLINE", "online"), ("off", "off"), ("0", "off")])
def test_the_setting_names_a_mode(monkeypatch, raw, mode):
    if raw is None:
        monkeypatch.delenv("LAZYTRITON_TUNING", raising=False)
    else:
        monkeypatch.setenv("LAZYTRITON_TUNING", raw)
    assert settings.tuning_mode() == mode
    assert settings.settings().tuning == (mode != "off") and settings.settings().online == (mode == "online")


def test_a_bad_setting_stops_the_program_naming_the_variable_and_what_it_takes(monkeypatch):
    monkeypatch.setenv("LAZYTRITON_TUNING", "onlin")
    with pytest.raises(settings.SettingError, match=r"LAZYTRITON_TUNING='onlin'.*'online'"):
        settings.check_environment()


def test_a_kernel_s_tuning_wins_over_the_setting_but_off_turns_timing_off(monkeypatch):
    monkeypatch.delenv("LAZYTRITON_TUNING", raising=False)
    assert lazytriton.kernel(bump).tuning_mode == "first_call"
    assert lazytriton.kernel(bump, tuning="online").tuning_mode == "online"
    monkeypatch.setenv("LAZYTRITON_TUNING", "online")
    assert lazytriton.kernel(bump).tuning_mode == "online"
    assert lazytriton.kernel(bump, tuning="first_call").tuning_mode == "first_call"
    monkeypatch.setenv("LAZYTRITON_TUNING", "off")
    assert lazytriton.kernel(bump, tuning="online").tuning_mode == "off"


def test_a_tuning_it_does_not_take_names_the_kernel_and_the_values():
    with pytest.raises(ValueError, match=r"kernel bump: tuning='fast'.*'online'.*LAZYTRITON_TUNING"):
        lazytriton.kernel(bump, tuning="fast")


def test_online_samples_is_checked_and_stays_out_of_the_first_call_measurements_key():
    with pytest.raises(ValueError, match="online_samples=0"):
        lazytriton.TuneOptions(online_samples=0)
    parts = dict(fn=bump.fn, shape_sig={"x": "p"}, options={}, target=None, device_name="H", tune_key_values=(1,),
                 driver_version=1)
    assert measurements.measure_key(**parts, tune_options=lazytriton.TuneOptions()) == \
        measurements.measure_key(**parts, tune_options=lazytriton.TuneOptions(online_samples=9))


# -- the order candidates compile in --------------------------------------------------------------

def cand(i, config):
    return SimpleNamespace(index=i, config=config, bound=SimpleNamespace(
        constexprs={"BLOCK": config.kwargs["BLOCK"]}, options=SimpleNamespace(num_warps=config.num_warps)))


def test_without_evidence_the_quickest_compile_comes_first():
    cfgs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((1024, 4), (128, 4), (512, 1))]
    order = online.queue_order([cand(i, c) for i, c in enumerate(cfgs)], {})
    assert [c.index for c in order] == [1, 0, 2]  # costs 32, 256, 512 (compile.schedule.compile_cost: tile / warps)


def test_configs_measured_on_other_specializations_come_first_fastest_first():
    cfgs = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((1024, 4), (128, 4), (512, 2))]
    evidence = {measurements.config_id(cfgs[0]): 1.0, measurements.config_id(cfgs[2]): 1.4}
    order = online.queue_order([cand(i, c) for i, c in enumerate(cfgs)], evidence)
    assert [c.index for c in order] == [0, 2, 1]  # measured: fastest first; never measured: last


def test_evidence_averages_each_config_over_the_documents_of_its_family(tmp_path):
    cache = Cache(tmp_path)
    a, b = measurements.config_id(triton.Config({"B": 1})), measurements.config_id(triton.Config({"B": 2}))
    measurements.record(cache, "1" * 64, "k", {a: {"time_ms": 1.0}, b: {"time_ms": 2.0}}, family="f")
    measurements.record(cache, "2" * 64, "k", {a: {"time_ms": 3.0}, b: {"time_ms": 2.0}}, family="f")
    measurements.record(cache, "3" * 64, "k", {a: {"time_ms": 9.0}, b: {"time_ms": 1.0}}, family="other GPU")
    measurements.record(cache, "4" * 64, "other kernel", {a: {"time_ms": 9.0}, b: {"time_ms": 1.0}}, family="f")
    ev = measurements.evidence(cache, "f", "k")
    assert ev == pytest.approx({a: (1.0 + 1.5) / 2, b: (2.0 + 1.0) / 2})
    assert measurements.evidence(cache, "f", "k", exclude="1" * 64) == pytest.approx({a: 1.5, b: 1.0})


# -- the job agrees when a decision is made ------------------------------------------------------

def test_the_first_decision_published_is_every_process_s():
    store = MemoryStore()
    first = distributed.Agreement(store, rank=0, processes=2)
    second = distributed.Agreement(store, rank=1, processes=2)
    key = "c" * 64
    assert first.published("k", key) is None
    mine = ("entry 0", {"winner_index": 2}, b"cubin")
    assert first.decide("k", key, mine, lambda *a: pytest.fail("nothing to adopt")) == "entry 0"
    rec, origin, binary = second.published("k", key)
    assert rec["winner_index"] == 2 and origin["rank"] == 0 and binary == b"cubin"
    adopted = second.decide("k", key, ("entry 1", {"winner_index": 0}, None),
                            lambda rec, origin, binary: f"adopted config {rec['winner_index']} of rank {origin['rank']}")
    assert adopted == "adopted config 2 of rank 0"


# -- the runtime, in processes of its own ------------------------------------------------------

@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("fake-cuda")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(d / "libcuda.so.1"), str(HERE / "fake_cuda" / "fake_cuda.c")],
                   check=True)
    return d


@pytest.fixture(scope="module")
def triton_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("triton-cache")  # shared: later processes compile from Triton's cache


def worker_env(fake, tmp_path, triton_cache, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAZYTRITON_", "FAKE_CUDA_"))}
    env.update(LD_LIBRARY_PATH=str(fake), TRITON_LIBCUDA_PATH=str(fake), FAKE_CUDA_LOG=str(tmp_path / "launches.jsonl"),
               FAKE_CUDA_PARAM_SIZES="bump:8,4,8,8", FAKE_CUDA_LAUNCH_MS=TIMES,
               LAZYTRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_CACHE_DIR=str(triton_cache),
               TRITON_DEFAULT_FP_FUSION=os.environ.get("TRITON_DEFAULT_FP_FUSION", "1"),
               LAZYTRITON_COMPILE_WORKERS="0", TUNING="online", WAIT_COMPILED="1")
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def run(env: dict, args=()) -> tuple[dict, str]:
    r = subprocess.run([sys.executable, str(WORKER), *args], env=env, capture_output=True, text=True, timeout=600,
                       cwd=env["TRITON_CACHE_DIR"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_first_ready_then_one_timed_candidate_per_call_round_by_round_then_the_fastest_from_cpp(
        fake_libcuda, tmp_path, triton_cache):
    out, err = run(worker_env(fake_libcuda, tmp_path, triton_cache, CALLS="14", SAMPLES="3"))
    blocks = out["blocks"]
    # The first call launches the first candidate compiled, untimed; then three rounds of one timed
    # launch per call, each round every candidate once, in the same order (drift hits them alike).
    rounds = [blocks[1 + 3 * r: 4 + 3 * r] for r in range(3)]
    assert all(sorted(r) == [32, 64, 128] for r in rounds) and rounds[0] == rounds[1] == rounds[2], blocks
    assert out["online"]["timed_launches"] == 9 and out["online"]["untimed_launches"] == 1
    # The 11th call reads the last events and decides: config 1 (1 ms) from then on.
    assert out["history"][0]["calls"] == 11 and out["history"][0]["winner"] == 1
    assert blocks[10:] == [BLOCK_OF[1]] * 4 and out["after_blocks"] == [BLOCK_OF[1]] * 4
    assert out["crossings_after"] == 0  # installed: later calls never reach Python
    rec = out["records"][-1]
    assert rec["winner_index"] == 1 and rec["extra"] == {"online": True}
    assert rec["times"] == pytest.approx([3.0, 1.0, 2.0])  # each config's median, persisted like a tuned winner's
    assert "online tuning settled after 11 calls" in err


def test_the_default_mode_still_tunes_on_the_first_call(fake_libcuda, tmp_path, triton_cache):
    out, _ = run(worker_env(fake_libcuda, tmp_path, triton_cache, TUNING=None, CALLS="3"))
    assert out["online"]["sessions"] == 0 and out["tunes"] == 1
    assert out["blocks"] == [BLOCK_OF[1]] * 3 and out["records"][-1]["winner_index"] == 1


def test_the_setting_makes_every_kernel_tune_online(fake_libcuda, tmp_path, triton_cache):
    out, _ = run(worker_env(fake_libcuda, tmp_path, triton_cache, TUNING=None, LAZYTRITON_TUNING="online",
                            CALLS="12", SAMPLES="3"))
    assert out["online"]["sessions"] == 1 and out["tunes"] == 0 and out["history"][0]["winner"] == 1


def test_resolve_for_a_caller_that_does_not_ask_again_tunes_on_the_call(fake_libcuda, tmp_path, triton_cache):
    out, _ = run(worker_env(fake_libcuda, tmp_path, triton_cache, RESOLVE_FIRST="1", CALLS="3"))
    assert out["online"]["sessions"] == 0 and out["tunes"] == 1 and out["blocks"] == [BLOCK_OF[1]] * 3


def test_a_restart_continues_from_the_persisted_samples(fake_libcuda, tmp_path, triton_cache):
    env = worker_env(fake_libcuda, tmp_path, triton_cache, SAMPLES="3", AFTER="0")
    # The first call, then four timed launches: the first three are read by the calls after them
    # (the last one's events are read by no call of this process).
    first, _ = run({**env, "CALLS": "5"})
    assert first["online"]["settled"] == 0 and first["online"]["timed_launches"] == 4
    second, err = run({**env, "CALLS": "10"})
    assert "continues from 3 sample(s) persisted before" in err
    # Two more samples each: the first call, 6 timed calls, the deciding call.
    assert second["online"]["timed_launches"] == 6 and second["history"][0]["calls"] == 8
    assert second["history"][0]["winner"] == 1
    third, _ = run({**env, "CALLS": "2"})  # the winner is persisted: no session, no compile
    assert third["online"]["sessions"] == 0 and third["record_hits"] == 1 and third["compiles"] == 0
    assert third["blocks"] == [BLOCK_OF[1]] * 2


def test_a_candidate_that_fails_to_launch_is_dropped_once_and_the_call_completes(fake_libcuda, tmp_path,
                                                                                   triton_cache):
    out, err = run(worker_env(fake_libcuda, tmp_path, triton_cache, FAKE_CUDA_FAIL_BLOCK="64", CALLS="12",
                              SAMPLES="3"))
    # The worker checks that every call launched exactly one kernel: the failed ones launched another.
    assert err.count("failed to launch") == 1 and "config 1" in err.split("failed to launch")[0].splitlines()[-1]
    assert out["online"]["dropped"] == 1 and BLOCK_OF[1] not in out["blocks"]
    assert out["history"][0]["winner"] == 2 and set(out["history"][0]["medians"]) == {"0", "2"}


def test_events_are_read_when_the_gpu_has_passed_them_never_waited_for(fake_libcuda, tmp_path, triton_cache):
    out, _ = run(worker_env(fake_libcuda, tmp_path, triton_cache, FAKE_CUDA_EVENT_LAG="2", CALLS="16", SAMPLES="3"))
    # The last launches needed are made before their events are passed: the calls between launch the
    # best so far, untimed, until the decision.
    assert out["online"]["timed_launches"] == 9 and out["online"]["untimed_launches"] > 1
    assert out["history"][0]["winner"] == 1 and out["history"][0]["calls"] > 11


def test_a_call_under_capture_launches_the_best_so_far_untimed(fake_libcuda, tmp_path, triton_cache):
    out, _ = run(worker_env(fake_libcuda, tmp_path, triton_cache, CAPTURE_CALL="4", CALLS="14", SAMPLES="3"))
    # Calls 1-3 timed each candidate once: config 1 is the best so far; the captured call launches it.
    assert out["blocks"][4] == BLOCK_OF[1]
    assert out["online"]["timed_launches"] == 9 and out["online"]["untimed_launches"] == 2
    assert out["history"][0]["winner"] == 1


def test_compiled_ahead_the_first_call_launches_the_first_in_the_queue(fake_libcuda, tmp_path, triton_cache):
    out, _ = run(worker_env(fake_libcuda, tmp_path, triton_cache, AHEAD="1", CALLS="12", SAMPLES="3"))
    # Every binary is in the cache: the stream yields them in queue order, the quickest compile
    # (num_warps=4: compile.schedule.compile_cost) first, and nothing compiles at the first call.
    assert out["compiles_at_first_call"] == 0 and out["blocks"][0] == BLOCK_OF[2]
    assert out["history"][0]["winner"] == 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ranks_that_time_differently_agree_on_the_first_decision(fake_libcuda, tmp_path, triton_cache):
    """Two processes of a jax.distributed job, each timing its own calls; on rank 1 config 0 is the
    fastest, on rank 0 config 1: each launches the first decision published from then on."""
    pytest.importorskip("jax")
    port, procs = free_port(), []
    for rank, times in enumerate((TIMES, "32:0.5,64:1,128:2")):
        d = tmp_path / f"rank{rank}"
        d.mkdir()
        env = worker_env(fake_libcuda, d, triton_cache, FAKE_CUDA_LAUNCH_MS=times, CALLS="14", SAMPLES="3")
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(rank), "2", str(port)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=d))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=600))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, o[-2000:] + e[-4000:]
    res = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    own = [r["history"][0]["winner"] for r in res]
    assert own == [1, 0]  # each decided its own fastest
    final = [r["after_blocks"] for r in res]
    assert final[0] == final[1] and len(set(final[0])) == 1  # and both launch one config: the first published
    agreed = [r["records"][-1]["extra"].get("agreed") for r in res]
    assert sum(a is not None for a in agreed) == 1  # the one that adopted says whose it is


# -- the JAX face: call sites resolved as the XLA handler resolves them, launched by its C++ ---------------

JAX_SCRIPT = """
import json, os, sys, time
sys.path.insert(0, {tests!r})
import jax, jax.numpy as jnp, triton, triton.language as tl
from lazytriton import _core
from lazytriton import jax as ltj
from fake_cuda.launch_probe import jax_site

@triton.autotune(configs=[triton.Config({{"BLOCK": 256}}, num_warps=w) for w in (1, 2, 4)], key=["n"])
@triton.jit
def plus_one(x, out, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(x + offs, mask=offs < n) + 1, mask=offs < n)

n = 4096
site = jax_site(lambda x: ltj.triton_call(x, kernel=plus_one, out_type=x, n=n,
                                          grid=lambda m: (triton.cdiv(n, m["BLOCK"]),)),
                jax.ShapeDtypeStruct((n,), jnp.float32))
bufs = ((0x7F0000000000, 4 * n), (0x7F0000100000, 4 * n))
capturing = [False]
call_site = _core.CallSite("plus_one", 2, lambda key: site.resolve(bufs, 0, 0, capturing[0]))

def launched():
    if not os.path.exists(os.environ["FAKE_CUDA_LOG"]):
        return []
    with open(os.environ["FAKE_CUDA_LOG"]) as f:
        return [json.loads(line)["block"] for line in f if "plus_one" in line]

blocks = []
for i in range(int(os.environ["CALLS"])):
    capturing[0] = i == int(os.environ.get("CAPTURE_CALL", "-1"))
    before = len(launched())
    call_site.launch(0, [b[0] for b in bufs])
    now = launched()
    assert len(now) == before + 1, (i, len(now) - before)
    blocks.append(now[-1])
    while i == 0 and any(s.compiling for s in site.lazy._online.values()):
        time.sleep(0.02)
print(json.dumps({{"blocks": blocks, "resolved": call_site.resolved, "sessions": len(site.lazy._online),
                  "winner": site.lazy.records[-1].winner_index if site.lazy.records else None}}))
"""


def run_jax(env: dict) -> tuple[dict, str]:
    script = Path(env["FAKE_CUDA_LOG"]).parent / "jax_online.py"  # Triton reads a kernel's source from its file
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(JAX_SCRIPT.format(tests=str(HERE)))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600,
                       cwd=env["TRITON_CACHE_DIR"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def jax_env(fake, tmp_path, triton_cache, **extra):
    pytest.importorskip("jax")
    return worker_env(fake, tmp_path, triton_cache, TUNING=None, LAZYTRITON_TUNING="online", JAX_PLATFORMS="cpu",
                      FAKE_CUDA_PARAM_SIZES="plus_one:8,8,4,8,8", **extra)


def test_jax_executions_each_launch_one_candidate_until_the_winner_is_installed(fake_libcuda, tmp_path,
                                                                               triton_cache):
    out, _ = run_jax(jax_env(fake_libcuda, tmp_path, triton_cache, CALLS="14"))
    blocks = out["blocks"]
    # Five samples each by default: the first execution, 15 timed ones would be needed; here 13 are made.
    assert all(sorted(blocks[1 + 3 * r: 4 + 3 * r]) == [32, 64, 128] for r in range(4)), blocks
    assert out["resolved"] == 0 and out["sessions"] == 1  # one-call entries only: nothing installed yet
    out, _ = run_jax(jax_env(fake_libcuda, tmp_path / "again", triton_cache, CALLS="20"))
    assert out["winner"] == 1 and out["resolved"] == 1 and out["sessions"] == 0
    assert out["blocks"][17:] == [BLOCK_OF[1]] * 3  # the 17th execution decided; the winner is installed


def test_jax_a_candidate_failing_in_the_handler_s_cpp_is_dropped_and_the_execution_launches_another(
        fake_libcuda, tmp_path, triton_cache):
    out, err = run_jax(jax_env(fake_libcuda, tmp_path, triton_cache, CALLS="14", FAKE_CUDA_FAIL_BLOCK="64"))
    assert err.count("failed to launch") == 1 and BLOCK_OF[1] not in out["blocks"]
    assert out["winner"] == 2 and out["resolved"] == 1


def test_jax_an_execution_under_capture_launches_the_best_so_far(fake_libcuda, tmp_path, triton_cache):
    out, _ = run_jax(jax_env(fake_libcuda, tmp_path, triton_cache, CALLS="6", CAPTURE_CALL="4"))
    assert out["blocks"][4] == BLOCK_OF[1] and out["resolved"] == 0  # not installed: tuning goes on


# -- the harness's rows ----------------------------------------------------------------------------

def test_the_harness_section_says_first_call_vs_the_quickest_config_calls_winner_and_extra_seconds(tmp_path):
    from lazytriton.bench import cli, online as bench_online, plan, report

    groups, _ = plan.build("quick", gpus=1, importable=lambda m: True, only={"online"})
    names = {g.name for g in groups if g.name.startswith("online-")}
    assert names == set(bench_online.GROUPS) and all(g.fresh_cache == g.name for g in groups if g.name in names)
    raw = {"imports_s": 2.0, "ref_max": 100.0, "max_err": 0.01}
    firsts = {"triton": 4.0, "first_call": 1.2, "online": 0.42, "one": 0.40}
    outputs = []
    for group, (kernel, mode) in bench_online.GROUPS.items():
        r = dict(raw, first_call_s=firsts[mode])
        if mode == "online":
            r["online"] = {"calls_s": [0.0011, 0.0009, 0.0012], "settled_after_calls": 4, "steady_call_s": 0.001,
                           "extra_s": 0.0002, "winner": 3, "today_winner": 3, "winner_ms": 0.101, "today_ms": 0.1}
        outputs.append({"group": group, "rep": 0, "sections": bench_online.sections(group, r)})
    secs = cli.merge(outputs)
    assert [r["system"] for r in secs["first_call"]["rows"]] == [
        "lazytriton, cold, online tuning (first call: one compile, no trials)"]
    rows = bench_online.table(secs["online"], report.median_process)
    assert [r[0] for r in rows] == ["demo matmul", "field package's matmul (mm_plain)"]
    demo = dict(zip(bench_online.HEADER, rows[0]))
    assert demo["online first call / that"] == "1.05"
    assert demo["calls until the winner is fixed (each, ms; first process)"] == "4 calls: 1.1, 0.9, 1.2 ms"
    assert demo["extra s over those calls"] == "0.000" and demo["winner's kernel time vs today's winner"] == \
        "+1.0% (config 3 vs 3)"
    md = report.write({"sections": secs}, tmp_path).read_text()
    assert "| demo matmul | 4 | 1.2 | 0.42 | 0.4 | 1.05 |" in md


def test_the_harness_script_is_python():
    from lazytriton.bench import online as bench_online

    compile(bench_online.SCRIPT, "online", "exec")


# -- C++ lazy mode: each call's candidate from the embedded Python, launched and timed by C++ ----------

LAZY_KERNELS = """
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 256}, num_warps=w) for w in (1, 2, 4)], key=["n"])
@triton.jit
def bump(x, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(x + offs, tl.load(x + offs, mask=m) + 1, mask=m)
"""

LAZY_AHEAD = """
import sys
sys.path.insert(0, {src!r})
import lazytriton
from lazytriton.model.arrays import DeviceArray
from online_kernels import bump
x = DeviceArray(0x7F0000000000, "fp32", 4 * 4096, (4096,))
print(lazytriton.kernel(bump).compile_ahead(x, 4096).result())
"""

LAZY_PROGRAM = r"""
#include <lazytriton/embed.h>
#include <cstdio>
#include <cstdlib>

// argv: bundle, kernels' directory, calls. One line per call: Python's resolutions so far.
int main(int argc, char** argv) {
  lt::Bundle b = lt::Bundle::open(argv[1]);
  lt::enable_lazy(b, {{argv[2]}});
  auto bump = b.kernel("online_kernels:bump", "*fp32,i32");
  float* x = reinterpret_cast<float*>(0x7F0000000000ull);
  int n = 4096;
  for (int i = 0, calls = std::atoi(argv[3]); i < calls; ++i) {
    bump.launch(nullptr, [&](const lt::Meta& m) { return lt::Dim3{unsigned((n + m["BLOCK"] - 1) / m["BLOCK"])}; },
                {x, n});
    std::printf("%llu\n", (unsigned long long)lt::lazy_stats().resolutions);
  }
}
"""


@pytest.fixture(scope="module")
def lazy_program(tmp_path_factory):
    from test_embed import CMAKE, cmake_build, cmake_project

    from lazytriton import paths

    if CMAKE is None:
        pytest.skip("needs cmake")
    if not list(Path(paths.cmake_dir()).parent.parent.glob("liblazytriton_embed*")):
        pytest.skip("lazytriton::embed not built (no shared libpython)")
    src = tmp_path_factory.mktemp("lazy-online")
    (src / "online_kernels.py").write_text(LAZY_KERNELS)
    (src / "lazy_online.cc").write_text(LAZY_PROGRAM)
    (src / "CMakeLists.txt").write_text(cmake_project("lazy_online", "lazy_online.cc").replace(
        "lazytriton::runtime", "lazytriton::embed"))
    cmake_build(src, src / "build")
    return src


def test_cpp_lazy_mode_tunes_online_over_its_calls_then_launches_the_winner_from_the_bundle(
        fake_libcuda, tmp_path, triton_cache, lazy_program):
    env = worker_env(fake_libcuda, tmp_path, triton_cache, TUNING=None, WAIT_COMPILED=None,
                     LAZYTRITON_TUNING="online", FAKE_CUDA_PARAM_SIZES="bump:8,4,8,8")
    bundle_dir, log = tmp_path / "bundle", tmp_path / "launches.jsonl"

    def launched() -> list[int]:
        return [json.loads(ln)["block"] for ln in log.read_text().splitlines() if '"bump' in ln] if log.exists() else []

    def program(calls: int) -> list[int]:
        r = subprocess.run([str(lazy_program / "build" / "lazy_online"), str(bundle_dir), str(lazy_program),
                            str(calls)], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-6000:]
        return [int(v) for v in r.stdout.split()]

    def persisted_samples() -> int:
        docs = [measurements.decode(p.stem, p.read_bytes()) for p in (tmp_path / "cache").rglob("*.ltm")]
        return sum(len(r.get("samples", ())) for d in docs for r in d.values())

    # Every call reaches Python (one resolution each) and launches one candidate, until the winner is
    # fixed: the first call the first candidate compiled, untimed; then each call the one with the fewest
    # samples among those compiled, until each has 5 (the default online_samples); the call that decides
    # launches the winner, which goes into the bundle: later calls launch it from C++ alone.
    # Every candidate compiled ahead (from Python, same cache): each call of the programs below finds
    # all three at once, so which call launches what does not depend on how fast this machine compiles.
    ahead = subprocess.run([sys.executable, "-c", LAZY_AHEAD.format(src=str(lazy_program))], env=env,
                           capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert ahead.returncode == 0 and ahead.stdout.split()[-1] == "3", ahead.stdout + ahead.stderr[-4000:]
    # A process that stops before the decision: its samples are persisted as they are read.
    # All three are found in the cache before the first call picks: the first call launches the first in
    # the queue, untimed; the timed calls go round the three in the queue's order.
    assert program(6) == [1, 2, 3, 4, 5, 6] and launched() == [128, 128, 64, 32, 128, 64], launched()
    assert bundle.Bundle(bundle_dir).variants() == []
    kept = persisted_samples()
    assert kept == 4, kept  # calls 2-5's (call 6's events are never read)
    # The next process continues from them: 15 - kept timed calls, between its first and its deciding call.
    calls = 30
    resolutions = program(calls)
    blocks = launched()[6:]
    assert len(blocks) == calls, blocks  # one launch per call: no trials
    settled = resolutions[-1]
    assert resolutions == list(range(1, settled + 1)) + [settled] * (calls - settled), (resolutions, blocks)
    assert settled == 17 - kept, (kept, resolutions, blocks)
    assert all(launched()[:5 + settled].count(b) >= 5 for b in (32, 64, 128)), blocks
    assert blocks[settled - 1:] == [64] * (calls + 1 - settled), blocks  # config 1 (1 ms), from the decision on
    (variant,) = bundle.Bundle(bundle_dir).variants()
    assert variant["launch"]["num_warps"] == 2, variant
    (rec,) = [e for e in Cache(tmp_path / "cache").entries() if e.kind == "record"]
    full = Cache(tmp_path / "cache").show(rec.key)["record"]
    assert full["extra"].get("online") and [c["time_ms"] for c in full["candidates"]] == pytest.approx([3, 1, 2])
    # A later process: the bundle's winner, no Python at all.
    assert program(3) == [0, 0, 0] and launched()[6 + calls:] == [64] * 3
