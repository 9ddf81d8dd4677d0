"""The field corpus on the GPU: Triton kernels written by other projects,
imported from their installed packages (tests/field/upstream.py; never copied
here), run as their users run them.

Standalone face: the upstream PyTorch wrapper is called with torch tensors,
once with the module-global kernel it looks up replaced by
`lazytriton.kernel(original)` (the same LazyKernel object for a whole call
sequence), once with the original (upstream's own Triton launch), and both are
compared with a plain torch reference (tests/field/refs.py). Every call draws
fresh random data; the sequences vary what the users vary (optional tensors
None or given, flags, dtypes, small / odd / larger sizes) in a seeded random
order. Before the lazytriton call the allocator's free blocks of the outputs'
sizes are filled with 0xFF bytes (NaN for floats), so an output element the
launch fails to write shows.

JAX face: the same upstream kernels through `lazytriton.jax.triton_call`
inside `jax.jit` (command buffers forced on by tests/conftest.py), their index
maps / sequence offsets made by XLA ops in the same program, compared with a
reference, again with None and arrays varied. (No upstream JAX launch to
compare with: TransformerEngine's JAX primitives need its compiled
transformer_engine_jax; Liger and fla have none.)

`test_corpus_is_clean_under_memcheck` runs these tests again under
`compute-sanitizer --tool memcheck`, one process per project and XLA allocator
(LAZYTRITON_FIELD_QUICK=1: shorter sequences, reference comparisons only). Calls per kernel and face are printed
at the end of the module (and appended as JSON lines to
$LAZYTRITON_FIELD_COUNTS when set). Every test skips when its package is
absent (README, "Field corpus")."""
import collections
import contextlib
import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import triton  # noqa: E402

import lazytriton  # noqa: E402
from field import upstream  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.heavy]
TESTS = Path(__file__).resolve().parent
# Under memcheck (or for a quick look): shorter sequences and no upstream launches (their autotuners
# benchmark every config, which the sanitizer makes slow); the references still check every call.
QUICK = os.environ.get("LAZYTRITON_FIELD_QUICK") == "1"
STEPS = int(os.environ.get("LAZYTRITON_FIELD_STEPS", "4" if QUICK else "12"))
SEED = int(os.environ.get("LAZYTRITON_FIELD_SEED", "23"))
COUNTS: collections.Counter = collections.Counter()  # (kernel, face) -> calls launched through lazytriton
DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    yield
    if not COUNTS:
        return
    lines = [f"  {k:45s} {face:10s} {n:5d}" for (k, face), n in sorted(COUNTS.items())]
    versions = ", ".join(f"{d} {upstream.installed_version(t)}" for t, d in upstream.DISTRIBUTIONS.items())
    text = f"field corpus ({versions}): calls launched through lazytriton per kernel and face\n" + "\n".join(lines)
    tr = request.config.pluginmanager.get_plugin("terminalreporter")
    (tr.write_line if tr is not None else print)(text)
    path = os.environ.get("LAZYTRITON_FIELD_COUNTS")
    if path:
        with open(path, "a") as f:
            for (k, face), n in sorted(COUNTS.items()):
                f.write(json.dumps({"kernel": k, "face": face, "calls": n}) + "\n")


@pytest.fixture(autouse=True)
def cuda_torch(cache_dir):
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return cache_dir


# -- the standalone face -----------------------------------------------------------------------

class Counted:
    """What the upstream wrapper finds in place of its kernel: the one LazyKernel, counted."""

    def __init__(self, key: str):
        self.key = key
        self.lazy = lazytriton.kernel(upstream.kernel(key))
        self.calls = 0

    def __getitem__(self, grid):
        COUNTS[self.key, "standalone"] += 1
        self.calls += 1
        return self.lazy[grid]


class Faces:
    """Switches the globals the upstream wrappers look their kernels up in between the originals and
    lazytriton. `where`: the wrappers' module when it is not the kernels' own (TransformerEngine's
    PyTorch wrappers import the kernels into theirs)."""

    def __init__(self, *keys: str, where=None):
        self.slots = []
        for k in keys:
            module = where if where is not None else upstream.KERNELS[k][1]()
            attr = upstream.KERNELS[k][2]
            assert getattr(module, attr) is upstream.kernel(k), f"{module.__name__}.{attr} is not {k}"
            self.slots.append((module, attr, upstream.kernel(k), Counted(k)))

    def calls(self) -> int:
        return sum(c.calls for *_, c in self.slots)

    @contextlib.contextmanager
    def lazy(self):
        try:
            for module, attr, _, counted in self.slots:
                setattr(module, attr, counted)
            yield
        finally:
            for module, attr, original, _ in self.slots:
                setattr(module, attr, original)


def poison(*like) -> None:
    """Fills the caching allocator's free blocks of these tensors' sizes with 0xFF (NaN, -1): the next
    torch.empty of those sizes (the wrapper's outputs) starts from them, not from a previous result."""
    sizes = [t.numel() * t.element_size() for t in like if t is not None]
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    blocks = [torch.full((max(n, 1),), 255, dtype=torch.uint8, device="cuda") for n in sizes for _ in range(2)]
    del blocks


def same(got, want, what: str, exact: bool, rtol: float = 0, atol: float = 0) -> None:
    if want is None:
        assert got is None, what
        return
    assert got is not None and got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {None if got is None else (got.shape, got.dtype)} vs {(want.shape, want.dtype)}"
    if exact:
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=False, msg=lambda m: f"{what}: {m}")
    else:
        torch.testing.assert_close(got, want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def tol(dtype) -> dict:
    return {torch.float16: dict(rtol=1e-2, atol=1e-2), torch.bfloat16: dict(rtol=4e-2, atol=4e-2),
            torch.float32: dict(rtol=1e-4, atol=1e-5)}[dtype]


def run_both(faces: Faces, call, ref_outputs: tuple):
    """(lazytriton's outputs, upstream's outputs or None under QUICK); fresh inputs are the caller's."""
    theirs = None if QUICK else call()
    poison(*[t for t in ref_outputs if isinstance(t, torch.Tensor)])
    before = faces.calls()
    with faces.lazy():
        ours = call()
    torch.cuda.synchronize()
    assert faces.calls() > before, "the wrapper did not launch through lazytriton"
    return ours, theirs


# A sequence's calls are split over PARTS tests (`part`: each its own seed and kernel objects), so
# that pytest-xdist runs them side by side: one sequence of 12 calls, each compiling lazytriton's and
# the upstream's new specializations, ran for minutes on one worker of `pytest -n 14`.
PARTS = 1 if QUICK else int(os.environ.get("LAZYTRITON_FIELD_PARTS", "3"))
parts = pytest.mark.parametrize("part", range(PARTS))


def seeded(part: int) -> tuple[random.Random, int]:
    """This part's variant chooser and data seed (part 0: those of the unsplit sequence)."""
    return random.Random(SEED + 7919 * part), SEED + part


def sequence(rng: random.Random, variants: list, steps: int = STEPS, first: list | None = None,
             part: int = 0) -> list:
    """This part's share of a sequence of `steps` calls: `first` in order (part 0), then random
    variants (seeded): one process, one kernel object."""
    head = list(first or []) if part == 0 else []
    return head + [rng.choice(variants) for _ in range(max(0, -(-steps // PARTS) - len(head)))]


# TransformerEngine: make_row_id_map (3 kernels) + permute_with_mask_map + unpermute_with_mask_map

TE_KEYS = ("te._row_id_map_pass_1_kernel", "te._row_id_map_pass_2_kernel", "te._row_id_map_pass_3_kernel",
           "te._permute_kernel", "te._unpermute_kernel")


def te_step(faces, wrappers, gen, *, pad: bool, probs: bool, scale: bool, merging: bool, dtype, T: int, E: int,
            H: int, topk: int, label: str):
    from field import refs
    routing = refs.te_routing(T, E, topk, gen)
    x = torch.randn(T, H, device="cuda", generator=gen).to(dtype)
    p = torch.rand(T, E, device="cuda", generator=gen) * routing if probs else None
    if p is not None:
        p[torch.rand(T, E, device="cuda", generator=gen) < 0.05] = 0.0  # TE: a routed 0 marks a padded slot
    s = torch.randn(T, 24, device="cuda", generator=gen) if scale else None
    routed = int(routing.sum())
    if pad:
        pad_offsets, num_out = refs.te_pad_offsets(routing, 16)
    else:
        pad_offsets, num_out = None, routed
    merging_probs = torch.rand(T, E, device="cuda", generator=gen) if merging else None
    want_out, want_pscale, want_pprobs, dst = refs.te_permute(x, routing, p, s, pad_offsets, num_out)

    def call():
        row_id_map = wrappers.make_row_id_map(routing, T, E)
        out, pscale, pprobs = wrappers.permute_with_mask_map(x, row_id_map, p, s, pad_offsets, T, E, num_out, H,
                                                             24 if scale else 0)
        back, uprobs = wrappers.unpermute_with_mask_map(out, row_id_map, merging_probs, pprobs, pad_offsets, T, E, H)
        return out, pscale, pprobs, back, uprobs

    want_back, want_uprobs = refs.te_unpermute(want_out, routing, merging_probs, want_pprobs, pad_offsets)
    ours, theirs = run_both(faces, call, (want_out, want_pscale, want_pprobs, want_back, want_uprobs))
    names = ("permuted", "permuted_scale", "permuted_probs", "unpermuted", "unpermuted_probs")
    # Without fused padding, rows no token lands on are never written (torch.empty): TE leaves them.
    rows = torch.ones(num_out, dtype=torch.bool, device="cuda") if pad else \
        torch.zeros(num_out, dtype=torch.bool, device="cuda").index_fill_(0, dst, True)
    for i, name in enumerate(names):
        got, want = ours[i], (want_out, want_pscale, want_pprobs, want_back, want_uprobs)[i]
        if i < 3 and got is not None:
            got, want = got[rows], want[rows]
        exact = i != 3  # copies are exact; the unpermuted rows are fp32 sums cast back
        same(got, want, f"{label}: {name} vs reference", exact, **tol(dtype))
        if theirs is not None:
            t = theirs[i][rows] if i < 3 and theirs[i] is not None else theirs[i]
            same(got, t, f"{label}: {name} vs TransformerEngine's own launch", True)


@pytest.fixture(scope="module")
def te():
    try:
        wrappers = upstream.te_wrappers()
    except ImportError as exc:  # installed, but a module it needs is not
        pytest.skip(f"transformer-engine's permutation wrappers do not import here: {exc}")
    return wrappers


def te_variant(**kw):
    base = dict(pad=False, probs=False, scale=False, merging=False, dtype=torch.bfloat16, T=37, E=8, H=1000, topk=2)
    return {**base, **kw}


def test_te_permutation_pad_offsets_none_then_tensor(te):
    # The case: the first call has pad_offsets=None (FUSION_PAD=False, the pointer a constexpr
    # dropped from the parameters), the next one in the same process a tensor; then back and forth.
    faces = Faces(*TE_KEYS, where=te)
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    for i, pad in enumerate([False, True, False, True, True, False]):
        te_step(faces, te, gen, **te_variant(pad=pad), label=f"call {i} pad_offsets={'tensor' if pad else None}")


@parts
def test_te_permutation_sequence(te, part):
    faces = Faces(*TE_KEYS, where=te)
    rng, seed = seeded(part)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    variants = [te_variant(pad=pad, probs=probs, scale=scale, merging=merging, dtype=dt, T=T, E=E, H=H, topk=k)
                for pad in (False, True) for probs in (False, True) for scale in (False, True)
                for merging in (False, True) for dt in DTYPES
                for (T, E, H, k) in ((7, 4, 64, 1), (37, 8, 1000, 2), (300, 16, 4096, 4), (1, 8, 129, 8))]
    for i, v in enumerate(sequence(rng, variants, steps=STEPS + 4, part=part)):
        te_step(faces, te, gen, **v, label=f"step {i} {v}")


# Liger-Kernel: rms_norm, layer_norm, swiglu, cross_entropy, rope forward wrappers

@parts
def test_liger_rms_norm_sequence(part):
    mod = upstream.liger("rms_norm")
    from field import refs
    faces = Faces("liger._rms_norm_forward_kernel", "liger._block_rms_norm_forward_kernel")
    rng, seed = seeded(part)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    # (rows, cols): small, odd, one wide row, and many narrow rows (the block kernel: > 32768 rows, cols <= 256)
    variants = [dict(w=w, dtype=dt, shape=sh, mode=mode, offset=off, row_mode=rm)
                for w in (False, True) for dt in DTYPES for sh in ((4, 64), (37, 1000), (2, 8192), (40000, 128))
                for mode in ("llama", "gemma", "none") for off in (0.0, 1.0) for rm in (None, True)]
    first = [dict(w=False, dtype=torch.bfloat16, shape=(37, 1000), mode="llama", offset=0.0, row_mode=None),
             dict(w=True, dtype=torch.bfloat16, shape=(37, 1000), mode="llama", offset=0.0, row_mode=None)]
    for i, v in enumerate(sequence(rng, variants, first=first, part=part)):
        n, d = v["shape"]
        x = torch.randn(n, d, device="cuda", generator=gen).to(v["dtype"])
        w = (torch.randn(d, device="cuda", generator=gen) * 0.5 + 1).to(v["dtype"]) if v["w"] else None
        want = refs.rms_norm(x, w, 1e-6, v["offset"], v["mode"])
        call = lambda: mod.rms_norm_forward(x, w, 1e-6, v["offset"], v["mode"], v["row_mode"])[0]  # noqa: E731
        ours, theirs = run_both(faces, call, (want, want))
        # Casting mode "none" reduces in the input dtype: a half-precision sum of up to 8192 squares.
        t = dict(rtol=0.1, atol=0.1) if v["mode"] == "none" and v["dtype"] != torch.float32 else tol(v["dtype"])
        same(ours, want, f"step {i} {v}: vs reference", False, **t)
        if theirs is not None:
            same(ours, theirs, f"step {i} {v}: vs Liger's own launch", True)


@parts
def test_liger_layer_norm_swiglu_sequence(part):
    ln, sw = upstream.liger("layer_norm"), upstream.liger("swiglu")
    from field import refs
    faces = Faces("liger._layer_norm_forward_kernel", "liger._swiglu_forward_kernel")
    rng, seed = seeded(part)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    variants = [dict(op=op, dtype=dt, shape=sh, gm=gm) for op in ("layer_norm", "swiglu") for dt in DTYPES
                for sh in ((3, 64), (37, 1000), (256, 4096), (1, 11008)) for gm in (1.0, 0.5)]
    for i, v in enumerate(sequence(rng, variants, part=part)):
        n, d = v["shape"]
        dt = v["dtype"]
        if v["op"] == "layer_norm":
            x = torch.randn(n, d, device="cuda", generator=gen).to(dt)
            w = torch.randn(d, device="cuda", generator=gen).to(dt)
            b = torch.randn(d, device="cuda", generator=gen).to(dt)
            want = refs.layer_norm(x, w, b, 1e-5)
            call = lambda: ln.layer_norm_forward(x, w, b, 1e-5)[0]  # noqa: E731
        else:
            a = torch.randn(n, d, device="cuda", generator=gen).to(dt)
            b = torch.randn(n, d, device="cuda", generator=gen).to(dt)
            want = refs.swiglu(a, b, v["gm"])
            call = lambda: sw.swiglu_forward(a, b, v["gm"])[2]  # noqa: E731
        ours, theirs = run_both(faces, call, (want,))
        same(ours, want, f"step {i} {v}: vs reference", False, **tol(dt))
        if theirs is not None:
            same(ours, theirs, f"step {i} {v}: vs Liger's own launch", True)


@parts
def test_liger_cross_entropy_sequence(part):
    ce = upstream.liger("cross_entropy")
    from field import refs
    faces = Faces("liger.liger_cross_entropy_kernel")
    rng, seed = seeded(part)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    variants = [dict(weight=w, z=z, acc=acc, pred=pred, softcap=sc, reduction=red, smoothing=ls, grad=g, dtype=dt,
                     shape=sh)
                for w in (False, True) for z in (False, True) for acc in (False, True) for pred in (False, True)
                for sc in (None, 30.0) for red in ("mean", "sum", "none") for ls in (0.0, 0.1) for g in (False, True)
                for dt in (torch.float32, torch.bfloat16) for sh in ((4, 100), (37, 5000), (64, 32000))
                if not (w and ls)]  # liger's weighted label smoothing is its own formula: no torch reference
    first = [dict(weight=False, z=False, acc=False, pred=False, softcap=None, reduction="mean", smoothing=0.0,
                  grad=True, dtype=torch.float32, shape=(37, 5000)),
             dict(weight=True, z=True, acc=True, pred=True, softcap=30.0, reduction="mean", smoothing=0.0,
                  grad=True, dtype=torch.float32, shape=(37, 5000))]
    for i, v in enumerate(sequence(rng, variants, first=first, part=part)):
        n, V = v["shape"]
        x0 = (torch.randn(n, V, device="cuda", generator=gen) * 4).to(v["dtype"])
        target = torch.randint(0, V, (n,), device="cuda", generator=gen)
        target[torch.rand(n, device="cuda", generator=gen) < 0.2] = -100
        target[0] = 1  # one kept token at least
        weight = torch.rand(V, device="cuda", generator=gen) + 0.5 if v["weight"] else None
        lss = 1e-4 if v["z"] else 0.0
        loss_w, z_w, acc_w, pred_w = refs.cross_entropy(x0, target, weight, -100, lss, v["smoothing"],
                                                        v["reduction"], v["softcap"])

        def call():
            x = x0.clone().requires_grad_(v["grad"])  # the kernel writes the gradient into its input
            with torch.no_grad():
                loss, z, acc, pred, grad = ce.cross_entropy_forward(x, target, weight, -100, lss, v["smoothing"],
                                                                    v["reduction"], v["softcap"], v["z"], v["acc"],
                                                                    v["pred"])
            return loss, z, acc, pred, grad.detach() if v["grad"] else None

        ours, theirs = run_both(faces, call, (x0, loss_w, x0))
        what = f"step {i} {v}"
        t = dict(rtol=2e-3, atol=2e-3) if v["dtype"] == torch.float32 else dict(rtol=3e-2, atol=3e-2)
        torch.testing.assert_close(ours[0].float(), loss_w.float(), **t, msg=lambda m: f"{what}: loss: {m}")
        if v["z"]:
            torch.testing.assert_close(ours[1].float(), z_w.float(), **t, msg=lambda m: f"{what}: z_loss: {m}")
        if v["acc"]:
            torch.testing.assert_close(ours[2].float(), acc_w, rtol=0, atol=1e-6, msg=lambda m: f"{what}: acc: {m}")
        if v["pred"]:  # by value: half-precision logits tie
            keep = target != -100
            assert torch.equal(ours[3] == -1, ~keep), f"{what}: predicted tokens of ignored rows"
            logits = x0.float() if v["softcap"] is None else v["softcap"] * torch.tanh(x0.float() / v["softcap"])
            picked = logits[keep].gather(1, ours[3][keep][:, None])[:, 0]
            torch.testing.assert_close(picked, logits[keep].max(1).values, rtol=1e-5, atol=1e-5,
                                       msg=lambda m: f"{what}: predicted tokens: {m}")
        if theirs is not None:
            for name, a, b in zip(("loss", "z_loss", "accuracy", "predicted", "gradient"), ours, theirs):
                same(a, b, f"{what}: {name} vs Liger's own launch", True)


@parts
def test_liger_rope_sequence(part):
    rp = upstream.liger("rope")
    from field import refs
    faces = Faces("liger._triton_rope")
    rng, seed = seeded(part)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    variants = [dict(dtype=dt, b=b, s=s, hq=hq, hk=hk, d=d, partial=partial, cos_batch=cb)
                for dt in DTYPES for (b, s) in ((1, 7), (2, 37), (4, 256)) for (hq, hk) in ((4, 4), (8, 2), (5, 1))
                for d in (64, 128) for partial in (False, True) for cb in (1, "b")]
    for i, v in enumerate(sequence(rng, variants, part=part)):
        dt, b, s, hq, hk, d = v["dtype"], v["b"], v["s"], v["hq"], v["hk"], v["d"]
        rd = d // 2 if v["partial"] else d
        cb = b if v["cos_batch"] == "b" else 1
        # HF's layout: [b, h, s, d] views of [b, s, h, d] storage (rope writes in place through them).
        q0 = torch.randn(b, s, hq, d, device="cuda", generator=gen).to(dt)
        k0 = torch.randn(b, s, hk, d, device="cuda", generator=gen).to(dt)
        ang = torch.rand(cb, s, rd // 2, device="cuda", generator=gen) * 6.28
        cos, sin = torch.cat([ang.cos()] * 2, -1).to(dt), torch.cat([ang.sin()] * 2, -1).to(dt)
        want_q, want_k = refs.rope(q0.transpose(1, 2), k0.transpose(1, 2), cos, sin, rd)

        def call():
            q, k = q0.clone().transpose(1, 2), k0.clone().transpose(1, 2)
            out_q, out_k, _, _ = rp.rope_forward(q, k, cos, sin, None, 1, rd if v["partial"] else None)
            return out_q, out_k

        ours, theirs = run_both(faces, call, ())
        what = f"step {i} {v}"
        same(ours[0], want_q, f"{what}: q vs reference", False, **tol(dt))
        same(ours[1], want_k, f"{what}: k vs reference", False, **tol(dt))
        if theirs is not None:
            same(ours[0], theirs[0], f"{what}: q vs Liger's own launch", True)
            same(ours[1], theirs[1], f"{what}: k vs Liger's own launch", True)


# flash-linear-attention: fused_recurrent_fwd (heuristics over autotune; h0 / ht / cu_seqlens / gk optional),
# l2norm_fwd (fla's own CachedAutotuner subclass, and a plain Autotuner for wide rows)

def fla_fused_recurrent_inputs(gen, v):
    dt, B, T, H, K, V = v["dtype"], v["B"], v["T"], v["H"], v["K"], v["V"]
    if v["varlen"]:
        lengths = torch.randint(1, T + 1, (3,), generator=torch.Generator().manual_seed(gen.initial_seed() + T))
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).cuda()
        B, T = 1, int(lengths.sum())
    else:
        cu = None
    N = B if cu is None else len(cu) - 1
    q = torch.randn(B, T, H, K, device="cuda", generator=gen).to(dt)
    k = (torch.randn(B, T, H, K, device="cuda", generator=gen) / K ** 0.5).to(dt)
    vv = torch.randn(B, T, H, V, device="cuda", generator=gen).to(dt)
    gk = (-torch.rand(B, T, H, K, device="cuda", generator=gen) * 0.2) if v["gk"] else None
    h0 = torch.randn(N, H, K, V, device="cuda", generator=gen) if v["h0"] else None
    return q, k, vv, gk, h0, cu


@parts
def test_fla_fused_recurrent_sequence(part):
    fr = upstream.fla("ops.common.fused_recurrent")
    from field import refs
    faces = Faces("fla.fused_recurrent_fwd_kernel")
    rng, seed = seeded(part)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    variants = [dict(h0=h0, final=fs, varlen=vl, gk=gk, reverse=rv, dtype=dt, B=2, T=T, H=H, K=K, V=V)
                for h0 in (False, True) for fs in (False, True) for vl in (False, True) for gk in (False, True)
                for rv in (False, True) for dt in DTYPES for (T, H, K, V) in ((5, 2, 64, 64), (33, 3, 100, 48))]
    first = [dict(h0=False, final=False, varlen=False, gk=True, reverse=False, dtype=torch.bfloat16, B=2, T=33, H=2,
                  K=64, V=64),
             dict(h0=True, final=True, varlen=True, gk=True, reverse=False, dtype=torch.bfloat16, B=2, T=33, H=2,
                  K=64, V=64)]
    for i, v in enumerate(sequence(rng, variants, first=first, part=part)):
        q, k, vv, gk, h0, cu = fla_fused_recurrent_inputs(gen, v)
        scale = q.shape[-1] ** -0.5
        want_o, want_ht = refs.fused_recurrent(q, k, vv, gk, scale, h0, cu, v["reverse"])
        call = lambda: fr.fused_recurrent_fwd(q, k, vv, gk=gk, scale=scale, initial_state=h0,  # noqa: E731
                                              output_final_state=v["final"], reverse=v["reverse"], cu_seqlens=cu)
        ours, theirs = run_both(faces, call, (want_o, want_ht))
        what = f"step {i} {v}"
        t = dict(rtol=2e-2, atol=2e-2) if v["dtype"] != torch.float32 else dict(rtol=1e-3, atol=1e-3)
        same(ours[0], want_o, f"{what}: o vs reference", False, **t)
        same(ours[1], want_ht if v["final"] else None, f"{what}: final state vs reference", False, **t)
        if theirs is not None:  # the two autotuners may pick different num_warps: reduction order differs
            same(ours[0], theirs[0], f"{what}: o vs fla's own launch", False, rtol=1e-5, atol=1e-5)
            same(ours[1], theirs[1], f"{what}: final state vs fla's own launch", False, rtol=1e-5, atol=1e-5)


@parts
def test_fla_l2norm_sequence(part):
    l2 = upstream.fla("modules.norm.l2norm")
    from field import refs
    faces = Faces("fla.l2norm_fwd_kernel", "fla.l2norm_fwd_kernel_row")
    rng, seed = seeded(part)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    variants = [dict(dtype=dt, shape=sh, out=od) for dt in DTYPES for sh in ((3, 64), (1000, 100), (77, 2048))
                for od in (None, torch.float32)]
    for i, v in enumerate(sequence(rng, variants, part=part)):
        x = torch.randn(*v["shape"], device="cuda", generator=gen).to(v["dtype"])
        want = refs.l2norm(x, 1e-6).to(v["out"] or v["dtype"])
        call = lambda: l2.l2norm_fwd(x, 1e-6, v["out"])[0]  # noqa: E731
        ours, theirs = run_both(faces, call, (want, want))
        what = f"step {i} {v}"
        same(ours, want, f"{what}: vs reference", False, **tol(v["out"] or v["dtype"]))
        if theirs is not None:
            same(ours, theirs, f"{what}: vs fla's own launch", False, **tol(v["out"] or v["dtype"]))


# -- the JAX face ------------------------------------------------------------------------------------

@pytest.fixture
def jx(jax_gpu):
    import jax.numpy as jnp
    from lazytriton import jax as ltj
    return jax_gpu, jnp, ltj


def te_row_id_map_jnp(jnp, routing):
    """TE's row_id_map made by XLA ops: per token, its destination rows (descending) and their experts,
    then the count (TE's make_row_id_map layout; entries past the count are unused)."""
    T, E = routing.shape
    m = routing.astype(jnp.int32)
    counts = m.sum(0)
    dst = jnp.where(routing, jnp.cumsum(m, 0) - 1 + (jnp.cumsum(counts) - counts)[None, :], -1)
    order = jnp.argsort(-dst, axis=1, stable=True).astype(jnp.int32)
    return jnp.concatenate([jnp.take_along_axis(dst, order, 1), order, m.sum(1, keepdims=True)], 1).astype(jnp.int32)


def jax_te_program(x, scores, probs_src, merging_src, *, T, E, H, topk, pad, probs, merging, align=16):
    import jax
    import jax.numpy as jnp
    from lazytriton import jax as ltj
    common = upstream.te_kernels()
    permute, unpermute = common._permute_kernel, common._unpermute_kernel
    # Routing, index map and padding offsets: XLA ops in the same jitted program as the kernels.
    top = jax.lax.top_k(scores, topk)[1]
    routing = jnp.zeros((T, E), bool).at[jnp.arange(T)[:, None], top].set(True)
    row_id_map = te_row_id_map_jnp(jnp, routing)
    counts = routing.sum(0)
    if pad:
        padn = (counts + align - 1) // align * align - counts
        pad_offsets = (jnp.cumsum(padn) - padn).astype(jnp.int32)
        num_out = T * topk + E * (align - 1)  # an upper bound (static shape); unused rows stay zero
    else:
        pad_offsets, num_out = None, T * topk
    p = probs_src * routing if probs else None
    out_t = jax.ShapeDtypeStruct((num_out, H), x.dtype)
    pp_t = jax.ShapeDtypeStruct((num_out,) if probs else (0,), jnp.float32)
    # TE's own JAX path aliases pre-zeroed output_buf / permuted_probs_buf inputs to the outputs the kernel
    # writes through output_ptr / permuted_probs_ptr; with jax-triton 0.4's aliasing (an aliased input is
    # not declared again) the same is zeroed_outputs. The *_buf parameters (unused by the kernel) get
    # arrays made here, as TE's do.
    buf = jnp.zeros((num_out, H), x.dtype)
    pbuf = jnp.zeros(pp_t.shape, jnp.float32)
    grid = lambda m: (T, triton.cdiv(H, m["BLOCK_SIZE"]))  # noqa: E731
    out, pprobs = ltj.triton_call(
        x, row_id_map, p, None, None, pad_offsets, buf, pbuf, kernel=permute, out_type=(out_t, pp_t), grid=grid,
        zeroed_outputs=(0, 1) if pad else (), scale_hidden_dim=0, num_tokens=T, num_out_tokens=num_out,
        stride_row_id_map_token=2 * E + 1, stride_row_id_map_expert=1, stride_input_token=H,
        stride_input_hidden=1, stride_output_token=H, stride_output_hidden=1,
        stride_probs_token=E if probs else None, stride_probs_expert=1 if probs else None,
        stride_scale_token=None, stride_scale_hidden=None, stride_permuted_probs_token=1 if probs else None,
        stride_permuted_scale_token=None, stride_permuted_scale_hidden=None, num_experts=E, hidden_size=H,
        PERMUTE_PROBS=probs, PERMUTE_SCALE=False, FUSION_PAD=pad)
    mp = merging_src * routing if merging else None
    back, uprobs = ltj.triton_call(
        out, row_id_map, mp, pprobs if probs else None, pad_offsets, jnp.zeros((T, H), x.dtype),
        jnp.zeros((T, E) if probs else (0,), jnp.float32), kernel=unpermute,
        out_type=(jax.ShapeDtypeStruct((T, H), x.dtype),
                  jax.ShapeDtypeStruct((T, E) if probs else (0,), jnp.float32)),
        grid=grid, stride_row_id_map_token=2 * E + 1, stride_row_id_map_expert=1, stride_input_token=H,
        stride_input_hidden=1, stride_output_token=H, stride_output_hidden=1,
        stride_merging_probs_token=E if merging else None, stride_merging_probs_expert=1 if merging else None,
        stride_permuted_probs_token=1 if probs else None, stride_unpermuted_probs_token=E if probs else None,
        stride_unpermuted_probs_expert=1 if probs else None, num_experts=E, hidden_size=H,
        PROBS_LOAD_WIDTH=triton.next_power_of_2(E), WITH_MERGING_PROBS=merging, PERMUTE_PROBS=probs,
        FUSION_UNPAD=pad)
    return routing, out, pprobs, back, uprobs, (pad_offsets if pad else jnp.zeros((E,), jnp.int32))


def jax_rms_norm_program(a, b, w, *, mode, offset, with_w):
    import jax
    import jax.numpy as jnp
    from lazytriton import jax as ltj
    kern = upstream.kernel("liger._rms_norm_forward_kernel")
    # liger's casting modes (its _str_to_casting_mode): the kernel's constexpr values
    casting = {k: getattr(m, "value", m) for k, m in upstream.liger("rms_norm")._str_to_casting_mode.items()}
    x = a * 2 + b  # the input is made by XLA in the same program
    n, d = x.shape
    y_t = jax.ShapeDtypeStruct((n, d), x.dtype)
    r_t = jax.ShapeDtypeStruct((n,), jnp.float32 if mode in ("llama", "gemma") else x.dtype)
    bs = triton.next_power_of_2(d)
    return ltj.triton_call(Y_row_stride=d, X_ptr=x, X_row_stride=d, W_ptr=w if with_w else None,
                           W_row_stride=1 if with_w else 0, RSTD_row_stride=1, n_cols=d, eps=1e-6, offset=offset,
                           casting_mode=casting[mode], kernel=kern, out_type=(y_t, r_t), grid=(n,),
                           elementwise_affine=with_w, BLOCK_SIZE=bs, num_warps=4 if bs < 2048 else 8)


def jax_fla_fused_recurrent_program(q, k, v, gk, h0, lengths, *, with_h0, final, varlen, with_gk, reverse):
    import jax
    import jax.numpy as jnp
    from lazytriton import jax as ltj
    kern = upstream.kernel("fla.fused_recurrent_fwd_kernel")
    B, T, H, K = q.shape
    V = v.shape[-1]
    if varlen:  # sequence offsets made by XLA in the same program
        cu = jnp.concatenate([jnp.zeros((1,), lengths.dtype), jnp.cumsum(lengths)])
        N = lengths.shape[0]
    else:
        cu, N = None, B
    outs = [jax.ShapeDtypeStruct((B, T, H, V), jnp.float32)]
    if final:
        outs.append(jax.ShapeDtypeStruct((N, H, K, V), jnp.float32))
    BK, BV = triton.next_power_of_2(K), min(triton.next_power_of_2(V), 64)
    # o (and ht when the final state is wanted) are left unbound: triton_call fills them with out_type.
    operands = dict(q=q, k=k, v=v, g=None, g_gamma=None, gk=gk if with_gk else None, gv=None,
                    h0=h0 if with_h0 else None, cu_seqlens=cu, scale=K ** -0.5, B=B, T=T)
    if not final:
        operands["ht"] = None
    return ltj.triton_call(**operands, kernel=kern, out_type=tuple(outs), grid=(triton.cdiv(V, BV) * N * H,),
                           H=H, K=K, V=V, BK=BK, BV=BV, REVERSE=reverse, USE_G=False, USE_G_GAMMA=False,
                           USE_GK=with_gk, USE_GV=False)


@parts
def test_jax_te_permute_unpermute(jx, te, part):
    jax, jnp, ltj = jx
    from field import refs
    rng, seed = seeded(part)
    key = jax.random.key(seed)
    variants = [dict(pad=pad, probs=probs, merging=m, dtype=dt, T=T, E=E, H=H, topk=k)
                for pad in (False, True) for probs in (False, True) for m in (False, True)
                for dt in (jnp.bfloat16, jnp.float32) for (T, E, H, k) in ((37, 8, 1000, 2), (128, 16, 256, 4))]
    first = [dict(pad=False, probs=False, merging=False, dtype=jnp.bfloat16, T=37, E=8, H=1000, topk=2),
             dict(pad=True, probs=False, merging=False, dtype=jnp.bfloat16, T=37, E=8, H=1000, topk=2)]
    jitted = {}
    for i, v in enumerate(sequence(rng, variants, first=first, part=part)):
        statics = {k: v[k] for k in ("T", "E", "H", "topk", "pad", "probs", "merging")}
        f = jitted.setdefault(tuple(sorted(statics.items())) + (str(v["dtype"]),),
                              jax.jit(lambda *a, _s=statics: jax_te_program(*a, **_s)))
        key, *ks = jax.random.split(key, 5)
        x = jax.random.normal(ks[0], (v["T"], v["H"]), v["dtype"])
        scores = jax.random.uniform(ks[1], (v["T"], v["E"]))
        psrc = jax.random.uniform(ks[2], (v["T"], v["E"]), minval=0.1)
        msrc = jax.random.uniform(ks[3], (v["T"], v["E"]))
        for _ in range(2):  # the first execution runs eagerly, the second is recorded into a command buffer
            routing, out, pprobs, back, uprobs, pad_off = jax.block_until_ready(f(x, scores, psrc, msrc))
        COUNTS["te._permute_kernel", "jax"] += 2
        COUNTS["te._unpermute_kernel", "jax"] += 2
        tx = torch.from_numpy(np.asarray(x.astype(jnp.float32))).cuda()
        trout = torch.from_numpy(np.asarray(routing)).cuda()
        tp = torch.from_numpy(np.asarray(psrc)).cuda() * trout if v["probs"] else None
        tm = torch.from_numpy(np.asarray(msrc)).cuda() * trout if v["merging"] else None
        po = torch.from_numpy(np.asarray(pad_off).astype(np.int64)).cuda() if v["pad"] else None
        num_out = out.shape[0]
        want_out, _, want_pp, _ = refs.te_permute(tx, trout, tp, None, po, num_out)
        what = f"step {i} {v}"
        np.testing.assert_array_equal(np.asarray(out.astype(jnp.float32)), want_out.cpu().numpy(), err_msg=what)
        if v["probs"]:
            np.testing.assert_array_equal(np.asarray(pprobs), want_pp.cpu().numpy(), err_msg=what)
        want_back, want_up = refs.te_unpermute(torch.from_numpy(np.asarray(out.astype(jnp.float32))).cuda(), trout,
                                               tm, want_pp, po)
        t = tol(torch.bfloat16 if v["dtype"] == jnp.bfloat16 else torch.float32)
        np.testing.assert_allclose(np.asarray(back.astype(jnp.float32)), want_back.cpu().numpy(), err_msg=what, **t)
        if v["probs"]:
            np.testing.assert_array_equal(np.asarray(uprobs), want_up.cpu().numpy(), err_msg=what)


@parts
def test_jax_liger_rms_norm(jx, part):
    jax, jnp, ltj = jx
    from field import refs
    rng, seed = seeded(part)
    key = jax.random.key(seed)
    variants = [dict(mode=m, offset=o, with_w=w, dtype=dt, shape=sh) for m in ("llama", "gemma", "none") for o in (0.0, 1.0)
                for w in (False, True) for dt in (jnp.float16, jnp.bfloat16, jnp.float32)
                for sh in ((4, 64), (37, 1000), (3, 4096))]
    first = [dict(mode="llama", offset=0.0, with_w=False, dtype=jnp.bfloat16, shape=(37, 1000)),
             dict(mode="llama", offset=0.0, with_w=True, dtype=jnp.bfloat16, shape=(37, 1000))]
    for i, v in enumerate(sequence(rng, variants, first=first, part=part)):
        statics = dict(mode=v["mode"], offset=v["offset"], with_w=v["with_w"])
        f = jax.jit(lambda a, b, w, _s=statics: jax_rms_norm_program(a, b, w, **_s))
        key, k1, k2, k3 = jax.random.split(key, 4)
        n, d = v["shape"]
        a = jax.random.normal(k1, (n, d), v["dtype"])
        b = jax.random.normal(k2, (n, d), v["dtype"])
        w = (jax.random.normal(k3, (d,)) * 0.5 + 1).astype(v["dtype"])
        for _ in range(2):
            y, _ = jax.block_until_ready(f(a, b, w))
        COUNTS["liger._rms_norm_forward_kernel", "jax"] += 2
        tdt = {jnp.float16: torch.float16, jnp.bfloat16: torch.bfloat16, jnp.float32: torch.float32}[v["dtype"]]
        x = torch.from_numpy(np.asarray((a * 2 + b).astype(jnp.float32))).cuda().to(tdt)
        tw = torch.from_numpy(np.asarray(w.astype(jnp.float32))).cuda().to(tdt) if v["with_w"] else None
        want = refs.rms_norm(x, tw, 1e-6, v["offset"], v["mode"]).float().cpu().numpy()
        np.testing.assert_allclose(np.asarray(y.astype(jnp.float32)), want, err_msg=f"step {i} {v}", **tol(tdt))


@parts
def test_jax_fla_fused_recurrent(jx, part):
    jax, jnp, ltj = jx
    from field import refs
    rng, seed = seeded(part)
    key = jax.random.key(seed)
    variants = [dict(with_h0=h, final=f, varlen=vl, with_gk=g, reverse=r, dtype=dt, T=T, H=H, K=K, V=V)
                for h in (False, True) for f in (False, True) for vl in (False, True) for g in (False, True)
                for r in (False, True) for dt in (jnp.bfloat16, jnp.float32) for (T, H, K, V) in ((9, 2, 64, 64),
                                                                                                  (20, 3, 32, 100))]
    first = [dict(with_h0=False, final=False, varlen=False, with_gk=True, reverse=False, dtype=jnp.bfloat16, T=9, H=2,
                  K=64, V=64),
             dict(with_h0=True, final=True, varlen=True, with_gk=True, reverse=False, dtype=jnp.bfloat16, T=9, H=2,
                  K=64, V=64)]
    for i, v in enumerate(sequence(rng, variants, first=first, part=part)):
        statics = {k: v[k] for k in ("with_h0", "final", "varlen", "with_gk", "reverse")}
        f = jax.jit(lambda *a, _s=statics: jax_fla_fused_recurrent_program(*a, **_s))
        key, *ks = jax.random.split(key, 7)
        B, T, H, K, V = 2, v["T"], v["H"], v["K"], v["V"]
        lengths = jax.random.randint(ks[5], (3,), 1, T + 1)
        if v["varlen"]:
            B, T = 1, int(lengths.sum())
        N = 3 if v["varlen"] else B
        q = jax.random.normal(ks[0], (B, T, H, K), v["dtype"])
        k = (jax.random.normal(ks[1], (B, T, H, K)) / K ** 0.5).astype(v["dtype"])
        vv = jax.random.normal(ks[2], (B, T, H, V), v["dtype"])
        gk = -jax.random.uniform(ks[3], (B, T, H, K)) * 0.2
        h0 = jax.random.normal(ks[4], (N, H, K, V))
        for _ in range(2):
            res = jax.block_until_ready(f(q, k, vv, gk, h0, lengths))
        COUNTS["fla.fused_recurrent_fwd_kernel", "jax"] += 2
        t = lambda a: torch.from_numpy(np.asarray(a.astype(jnp.float32))).cuda()  # noqa: E731
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.from_numpy(np.asarray(lengths)).cumsum(0)]).cuda() \
            if v["varlen"] else None
        want_o, want_ht = refs.fused_recurrent(t(q), t(k), t(vv), t(gk) if v["with_gk"] else None, K ** -0.5,
                                               t(h0) if v["with_h0"] else None, cu, v["reverse"])
        what = f"step {i} {v}"
        tl_ = dict(rtol=2e-2, atol=2e-2)
        np.testing.assert_allclose(np.asarray(res[0]), want_o.cpu().numpy(), err_msg=what, **tl_)
        if v["final"]:
            np.testing.assert_allclose(np.asarray(res[1]), want_ht.cpu().numpy(), err_msg=what, **tl_)


# -- under compute-sanitizer -------------------------------------------------------------------------

# project -> -k selection of the tests above (one sanitized process each: a device command stays short)
MEMCHECK_GROUPS = {"transformer_engine": "te_", "liger_kernel": "liger", "fla_core": "fla"}


@pytest.mark.slow  # a pytest run of a project's tests under memcheck
@pytest.mark.parametrize("allocator", ["bfc", "platform"])
@pytest.mark.parametrize("group", sorted(MEMCHECK_GROUPS))
def test_corpus_is_clean_under_memcheck(tmp_path, group, allocator):
    """The tests above, again under memcheck (QUICK: shorter sequences, references only), with XLA's
    BFC allocator and with the platform allocator (one cudaMalloc per buffer: exact bounds)."""
    if shutil.which("compute-sanitizer") is None:
        pytest.skip("compute-sanitizer not installed")
    env = {**os.environ, "LAZYTRITON_CACHE_DIR": str(tmp_path / "ltcache"), "PYTHONUNBUFFERED": "1",
           "XLA_PYTHON_CLIENT_PREALLOCATE": "false", "LAZYTRITON_FIELD_QUICK": "1"}
    env.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    if allocator == "platform":
        env["XLA_PYTHON_CLIENT_ALLOCATOR"] = "platform"
    cmd = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "99", "--print-limit", "20",
           sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "--rootdir", str(TESTS.parent), "-c", str(TESTS.parent / "pyproject.toml"),
           str(Path(__file__).resolve()), "-k", f"{MEMCHECK_GROUPS[group]} and not memcheck"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1500, cwd=str(tmp_path))
    out = r.stdout + r.stderr
    print(f"[field {group} {allocator}] rc={r.returncode}\n" + "\n".join(out.splitlines()[-30:]))
    assert r.returncode == 0, out[-8000:]
    assert "ERROR SUMMARY: 0 errors" in out, out[-8000:]
    summary = [ln for ln in out.splitlines() if " passed" in ln]
    assert summary and not any(w in summary[-1] for w in ("failed", "error")), out[-4000:]
