"""Plain torch / jax.numpy references for the field corpus (tests/test_gpu_field.py):
what each upstream op computes, written from its documented semantics, not
from its kernel."""
from __future__ import annotations

import torch
import torch.nn.functional as F


# -- TransformerEngine MoE permutation ------------------------------------------------------------

def te_routing(T: int, E: int, topk: int, gen: torch.Generator) -> torch.Tensor:
    """A [T, E] bool routing map, `topk` experts per token (some tokens may route to none)."""
    scores = torch.rand(T, E, generator=gen, device="cuda")
    top = scores.topk(topk, dim=1).indices
    mask = torch.zeros(T, E, dtype=torch.bool, device="cuda").scatter_(1, top, True)
    dropped = torch.rand(T, generator=gen, device="cuda") < 0.1
    dropped[0] = False  # a few dropped tokens, never all (TE wants a positive output row count)
    mask[dropped] = False
    return mask


def te_pad_offsets(routing: torch.Tensor, align: int) -> tuple[torch.Tensor, int]:
    """TE's fused-padding offsets: expert e's rows move down by the padding of the experts before it;
    and the padded row count."""
    counts = routing.sum(0).to(torch.int64)
    aligned = (counts + align - 1) // align * align
    pad = aligned - counts
    return torch.cumsum(pad, 0) - pad, int(aligned.sum())


def te_dst_rows(routing: torch.Tensor, pad_offsets: torch.Tensor | None):
    """(token, expert, destination row) of every routed pair: expert-major, token order within an expert."""
    e, t = routing.t().nonzero(as_tuple=True)
    dst = torch.arange(len(e), device=routing.device)
    if pad_offsets is not None:
        dst = dst + pad_offsets[e]
    return t, e, dst


def te_permute(x, routing, probs, scale, pad_offsets, num_out):
    t, e, dst = te_dst_rows(routing, pad_offsets)
    out = torch.zeros(num_out, x.shape[1], dtype=x.dtype, device=x.device)
    out[dst] = x[t]
    pprobs = pscale = None
    if probs is not None:
        p = probs[t, e]
        out[dst[p == 0]] = 0  # TE: a routed slot with probability 0 is padding, its row is zeroed
        pprobs = torch.zeros(num_out, dtype=probs.dtype, device=x.device)
        pprobs[dst] = p
    if scale is not None:
        pscale = torch.zeros(num_out, scale.shape[1], dtype=scale.dtype, device=x.device)
        pscale[dst] = scale[t]
    return out, pscale, pprobs, dst


def te_unpermute(y, routing, merging_probs, permuted_probs, pad_offsets):
    T, E = routing.shape
    t, e, dst = te_dst_rows(routing, pad_offsets)
    rows = y[dst].float()
    if merging_probs is not None:
        rows = rows * merging_probs[t, e].float()[:, None]
    out = torch.zeros(T, y.shape[1], dtype=torch.float32, device=y.device).index_add_(0, t, rows).to(y.dtype)
    uprobs = None
    if permuted_probs is not None:
        uprobs = torch.zeros(T, E, dtype=permuted_probs.dtype, device=y.device)
        uprobs[t, e] = permuted_probs[dst]
    return out, uprobs


# -- Liger-Kernel ----------------------------------------------------------------------------------

def rms_norm(x, w, eps, offset, casting_mode):
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if casting_mode == "llama":
        y = (x32 * rstd).to(x.dtype)
        return y * (offset + w) if w is not None else y
    if casting_mode == "gemma":
        y = x32 * rstd
        return (y * (offset + w.float()) if w is not None else y).to(x.dtype)
    y = (x32 * rstd).to(x.dtype)  # "none": everything in the input dtype
    return y * (offset + w) if w is not None else y


def layer_norm(x, w, b, eps):
    return F.layer_norm(x.float(), (x.shape[-1],), w.float(), b.float(), eps).to(x.dtype)


def swiglu(a, b, gate_multiplier):
    return (F.silu(a.float() * gate_multiplier).to(b.dtype) * b)


def cross_entropy(x, target, weight, ignore_index, lse_square_scale, label_smoothing, reduction, softcap):
    """(loss, z_loss, token accuracy, predicted tokens), liger's definitions: the z-loss
    (lse_square_scale * lse**2 per kept token, unweighted, mean over kept tokens) is part of the loss."""
    logits = x.float()
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    keep = target != ignore_index
    n_keep = int(keep.sum())
    ce = F.cross_entropy(logits, target, weight=weight, ignore_index=ignore_index, reduction="none",
                         label_smoothing=label_smoothing)
    lse = torch.logsumexp(logits, -1)
    z = torch.where(keep, lse_square_scale * lse * lse, 0.0)
    if reduction == "mean":
        denom = weight[target[keep]].sum() if weight is not None else n_keep
        ce, z = ce / denom, z / n_keep
    loss = ce + z
    pred = torch.where(keep, logits.argmax(-1), -1)
    acc = torch.where(keep, (logits.argmax(-1) == target).float(), 0.0)
    if reduction == "none":
        return loss, z, acc, pred
    return loss.sum(), z.sum(), acc.sum() / n_keep, pred


def rope(q, k, cos, sin, rotary_dim):
    """HF apply_rotary_pos_emb on the first `rotary_dim` features (q, k: [b, h, s, d]; cos, sin: [1 or b, s, >=rd])."""
    def rot(x):
        rd = rotary_dim
        c = cos[..., : rd // 2].float()[:, None]
        s = sin[..., : rd // 2].float()[:, None]
        x1, x2, rest = x[..., : rd // 2].float(), x[..., rd // 2: rd].float(), x[..., rd:]
        return torch.cat([(x1 * c - x2 * s).to(x.dtype), (x2 * c + x1 * s).to(x.dtype), rest], -1)
    return rot(q), rot(k)


# -- flash-linear-attention -----------------------------------------------------------------------

def fused_recurrent(q, k, v, gk, scale, h0, cu_seqlens, reverse):
    """Gated linear attention, step by step (float64): S = S * exp(gk_t)[:, None] + k_t^T v_t, o_t = (q_t*scale) S.
    q, k, gk: [B, T, H, K]; v: [B, T, H, V]. Returns (o [B, T, H, V] fp32, final state [N, H, K, V] fp32)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if cu_seqlens is None:
        spans = [(b, 0, T) for b in range(B)]
    else:
        cs = cu_seqlens.tolist()
        spans = [(0, cs[i], cs[i + 1]) for i in range(len(cs) - 1)]
    o = torch.zeros(B, T, H, V, dtype=torch.float64, device=q.device)
    hts = []
    for n, (b, bos, eos) in enumerate(spans):
        S = h0[n].double() if h0 is not None else torch.zeros(H, K, V, dtype=torch.float64, device=q.device)
        steps = range(eos - 1, bos - 1, -1) if reverse else range(bos, eos)
        for t in steps:
            if gk is not None:
                S = S * gk[b, t].double().exp()[:, :, None]
            S = S + k[b, t].double()[:, :, None] * v[b, t].double()[:, None, :]
            o[b, t] = torch.einsum("hk,hkv->hv", q[b, t].double() * scale, S)
        hts.append(S)
    return o.float(), torch.stack(hts).float()


def l2norm(x, eps):
    x32 = x.float()
    return x32 / torch.sqrt((x32 * x32).sum(-1, keepdim=True) + eps)
