"""Tuning starts while candidates still compile (compile_stream feeds tune):
every trial still starts from the caller's data, also when a candidate that
arrives later writes a buffer that the earlier ones do not (the snapshot grows
then), and the result is one launch of the winner on the original data."""
import numpy as np
import pytest
import triton

import lazytriton
from lazytriton import _core
from lazytriton.compile.compiler import Binder, Candidate, compile_all
from lazytriton.compile.targets import device_target
from lazytriton.model.spec import kernel_spec
from lazytriton.runtime.tuner import TuneOptions, trial_entry, tune

from kernels import overlap

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")

N = 1 << 20


def buffers():
    rng = np.random.default_rng(0)
    x = cp.asarray(rng.standard_normal(N).astype(np.float32))
    out = cp.asarray(rng.standard_normal(N).astype(np.float32))
    side = cp.asarray(rng.standard_normal(N).astype(np.float32))
    return x, out, side


def table(args):
    """The call's slot table rows, one per argument (as the stubs read them)."""
    return list(lazytriton.kernel(overlap.accumulate_side)._shape(args).table()[:len(args)])


def expected(x0, out0, side0, winner_meta):
    return (out0 + x0).get(), (side0 + (1.0 if winner_meta["SIDE"] else 0.0)).get()


@pytest.mark.parametrize("order", [[0, 1, 2, 3], [2, 0, 3, 1], [1, 3]])
def test_later_candidate_writing_more_buffers_is_covered(cache_dir, order):
    x, out, side = buffers()
    x0, out0, side0 = x.copy(), out.copy(), side.copy()
    spec = kernel_spec(overlap.accumulate_side)
    dev = _core.device_info(_core.current_device())
    target = device_target(dev["capability"])
    binder = Binder(spec, target)
    names = ["x", "out", "side", "n"]
    from lazytriton.model.arrays import PointerArg, array_info

    arrays, bind_vals = {}, []
    for name, v in zip(names, (x, out, side, N)):
        if name == "n":
            bind_vals.append(v)
            continue
        info = array_info(v, name)
        arrays[name] = (info.ptr, info.nbytes)
        bind_vals.append(PointerArg(info.ptr, info.dtype))
    cands = [Candidate(i, c, binder.bind(tuple(bind_vals), c.all_kwargs())) for i, c in enumerate(spec.configs)]
    compile_all(spec, target, cands)
    stream = cp.cuda.get_current_stream().ptr
    winner = tune(spec.name, iter([cands[i] for i in order]), names, (x, out, side, N), arrays,
                  table((x, out, side, N)), lambda c: (triton.cdiv(N, c.config.kwargs["B"]),), stream, _core.current_device(), [], [],
                  TuneOptions(target_ms=2.0, retime_target_ms=2.0))
    assert all(cands[i].extra.get("time_ms") for i in order), [cands[i].error for i in order]
    # The caller's buffers are back to the original data (the winner has not run).
    cp.cuda.runtime.deviceSynchronize()
    np.testing.assert_array_equal(out.get(), out0.get())
    np.testing.assert_array_equal(side.get(), side0.get())
    assert winner.index in order
    assert winner.extra["tune_s"] > 0  # the tuner counts its seconds in trials (the field reference sums them)


def test_first_call_equals_one_launch_of_the_winner(cache_dir):
    k = lazytriton.kernel(overlap.accumulate_side)
    x, out, side = buffers()
    x0, out0, side0 = x.copy(), out.copy(), side.copy()
    k[lambda m: (triton.cdiv(N, m["B"]),)](x, out, side, N)
    cp.cuda.runtime.deviceSynchronize()
    rec = k.records[-1]
    assert sum(c["time_ms"] is not None for c in rec.candidates) == 4, rec.candidates
    want_out, want_side = expected(x0, out0, side0, overlap.SIDE_CONFIGS[rec.winner_index].kwargs)
    np.testing.assert_array_equal(out.get(), want_out)
    np.testing.assert_array_equal(side.get(), want_side)


def _two_candidates():
    """Two compiled configs of accumulate_side (B=1024 with 4 warps, B=128 with
    1 warp: different times), ready for _core's timing calls. The caller keeps
    the arrays alive: the kernels and the snapshot hold their raw pointers."""
    x, out, side = buffers()
    spec = kernel_spec(overlap.accumulate_side)
    target = device_target(_core.device_info(_core.current_device())["capability"])
    names = ["x", "out", "side", "n"]
    from lazytriton.model.arrays import PointerArg, array_info

    infos = {n: array_info(v, n) for n, v in (("x", x), ("out", out), ("side", side))}
    arrays = {n: (i.ptr, i.nbytes) for n, i in infos.items()}
    bind_vals = [PointerArg(i.ptr, "fp32") for i in infos.values()] + [N]
    cands = [Candidate(i, spec.configs[i], Binder(spec, target).bind(tuple(bind_vals), spec.configs[i].all_kwargs()))
             for i in (0, 3)]
    compile_all(spec, target, cands)
    grids = [(triton.cdiv(N, c.config.kwargs["B"]),) for c in cands]
    rows = table((x, out, side, N))
    launches = [trial_entry(spec.name, c, names, (x, out, side, N), arrays, rows, g) for c, g in zip(cands, grids)]
    stream = cp.cuda.get_current_stream().ptr
    snapshot = _core.Snapshot(stream, [arrays["out"], arrays["side"]])
    opts = {"warmup": 1, "target_ms": 5.0, "min_reps": 20, "max_reps": 200, "flush_l2": False}
    return (x, out, side), [e for e, _ in launches], launches[0][1], stream, snapshot, opts


def test_interleaved_bench_starts_every_launch_from_the_snapshot(cache_dir):
    """The second pass's timing: every candidate gets the same repetitions, and
    every launch starts from the snapshot (the kernel accumulates into `out`)."""
    (x, out, side), entries, bufs, stream, snapshot, opts = _two_candidates()
    out0 = out.copy()
    together = _core.bench_interleaved(entries, stream, bufs, snapshot, [], opts)
    assert together[0]["reps"] == together[1]["reps"] >= 20
    assert all(0 < r["min_ms"] <= r["median_ms"] for r in together), together
    cp.cuda.runtime.deviceSynchronize()
    # Each launch started from the snapshot: the last one left out0 + x, not out0 + (launches) * x.
    np.testing.assert_array_equal(out.get(), (out0 + x).get())
    # An entry reads its buffers by index: too few of them is refused before anything launches.
    with pytest.raises(_core.RuntimeFailure, match=r"kernel accumulate_side: parameter 2 reads buffer 2 of 2"):
        _core.bench_interleaved(entries, stream, bufs[:2], None, [], opts)


def test_interleaved_bench_times_each_kernel_as_it_times_alone(cache_dir):
    """Interleaved, each candidate gets the time it gets alone (not under memcheck: timing)."""
    arrays, entries, bufs, stream, snapshot, opts = _two_candidates()  # arrays: kept alive
    alone = [_core.bench(e, stream, bufs, snapshot, [], opts)["median_ms"] for e in entries]
    together = _core.bench_interleaved(entries, stream, bufs, snapshot, [], opts)
    for a, r in zip(alone, together):
        assert r["median_ms"] == pytest.approx(a, rel=0.3), (alone, together)
    assert (alone[0] < alone[1]) == (together[0]["median_ms"] < together[1]["median_ms"]), (alone, together)
