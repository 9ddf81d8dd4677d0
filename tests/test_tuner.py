"""The tuner's second pass: which candidates are timed again against each
other, and what their times become. The device's part (launches interleaved
one by one, lazytriton._core.bench_interleaved) is replaced here by a recorder
that answers scripted medians; it runs for real in
tests/test_gpu_tune_overlap.py, and the harness reports the chosen/best ratio."""
from __future__ import annotations

import pytest

from lazytriton.runtime import tuner
from lazytriton.compile.compiler import Candidate
from lazytriton.runtime.tuner import TuneOptions


class _Saved:
    snapshot = None


def candidates(first_pass_ms: list[float]) -> list[Candidate]:
    out = []
    for i, ms in enumerate(first_pass_ms):
        c = Candidate(i, None, bound=None)
        c.extra["time_ms"] = ms
        out.append(c)
    return out


def retime(monkeypatch, cands, medians: dict, fail: Exception | None = None, **opts) -> list:
    """Runs tuner._retime; the interleaved bench answers medians[index].
    Returns the calls it got: (candidate indices, options)."""
    calls = []

    def bench_interleaved(entries, stream, buffers, snapshot, zero, options):
        calls.append(([e.index for e in entries], options))
        if fail is not None:
            raise fail
        return [{"median_ms": medians[e.index], "min_ms": medians[e.index] * 0.99, "reps": 42} for e in entries]

    monkeypatch.setattr(tuner._core, "bench_interleaved", bench_interleaved)
    # The "entry" handed to the bench: the candidate.
    monkeypatch.setattr(tuner, "trial_entry", lambda name, c, names, values, arrays, table, grid: (c, []))
    tuner._retime("k", cands, [], (), {}, [], lambda c: (1,), 0, _Saved(), [], TuneOptions(**opts))
    return calls


def test_the_close_candidates_are_timed_together_best_first(monkeypatch):
    # 4 within 15% of the best (0.0288 ms), at most retime_top of them; 3 is 30% slower.
    cands = candidates([0.0305, 0.0294, 0.0322, 0.0375, 0.0288, 0.0310])
    calls = retime(monkeypatch, cands, {4: 0.0285, 1: 0.0296, 0: 0.0301, 5: 0.0309})
    assert [c[0] for c in calls] == [[4, 1, 0, 5]]
    opts = calls[0][1]
    assert opts["target_ms"] == TuneOptions().retime_target_ms and opts["max_reps"] == TuneOptions().retime_max_reps
    assert opts["warmup"] == 1


def test_their_times_become_the_interleaved_medians(monkeypatch):
    # The first pass put 1 ahead; timed together, 0 is faster: it wins.
    cands = candidates([0.0310, 0.0300])
    retime(monkeypatch, cands, {0: 0.0290, 1: 0.0305})
    assert min(cands, key=lambda c: c.extra["time_ms"]).index == 0
    assert cands[0].extra["first_pass_ms"] == 0.0310 and cands[0].extra["time_ms"] == 0.0290
    assert cands[1].extra["reps"] == 42


def test_nothing_is_timed_again_when_one_is_clearly_fastest(monkeypatch):
    cands = candidates([0.020, 0.040, 0.030])
    assert retime(monkeypatch, cands, {}) == []
    assert "first_pass_ms" not in cands[0].extra


def test_retime_top_below_two_turns_the_second_pass_off(monkeypatch):
    assert retime(monkeypatch, candidates([0.030, 0.0301]), {}, retime_top=1) == []


def test_a_failed_second_pass_names_the_kernel_and_candidates(monkeypatch):
    err = tuner._core.RuntimeFailure("CUDA_ERROR_ILLEGAL_ADDRESS (cuEventSynchronize)")
    with pytest.raises(tuner._core.RuntimeFailure, match=r"kernel k: re-timing default config, default config"):
        retime(monkeypatch, candidates([0.030, 0.0301]), {}, fail=err)
