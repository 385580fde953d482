"""Independent float64 reference of record_2026_07_17's (#89) model forward and training loss.

Follows only the record's description in docs/records.md: record_2026_07_17's D.1, D.2, D.4 and
D.10, C.1's smear and mask, and the shared norm; nothing of the project is imported. Exact math:
float64 everywhere, no bf16 / FP8 roundings (the FP8 MLP and head, bf16 rotary tables and bf16 sigma
of D.1/D.2 are deliberately absent). Citations: "fwd n" = D.1 forward-pass step n, "Attn n" = D.1
Attn_l step n, "MUDD" = D.1 MUDD paragraph, "VE gate" = D.1 gated value embeddings, "D.2" = loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

Tensor = torch.Tensor
F64 = torch.float64
EPS = 2.0**-23  # docs/records.md, shared ground: parameter-free RMSNorm, eps = 2^-23
HASH_CUR, HASH_PREV = 36_313, 27_191  # fwd 2


@dataclass
class ModelShape:
    n_layer: int = 11
    n_head: int = 6
    head_dim: int = 128
    vocab: int = 50304
    gate_channels: int = 12  # smear/attn gate input u[0:12]; VE gate uses 6 + 6
    bigram_rows: int = 754560
    bigram_dim: int = 192
    sign_rows: int = 8192
    mudd_hidden: int = 64
    # the per-layer table of D.1, resampled to n_layer by the caller; one char per layer
    attention: str = "AAAAAA.AAAA"  # A = attention, . = none
    paired: str = "P.P..P...P."
    window: str = "SSSLSS.SSSL"  # S short, L long (layer 6 ignored)
    key_offset: str = "...K......K"
    xsa: str = ".X.XX..XX.X"
    value_table: str = ".01.....234"  # table index per layer, "." none
    skip_from: int = 3
    skip_to: int = 6
    c7: int = 7  # c7: the layer whose output feeds layers > c7 and MUDD
    softcap: float = 23.0
    softcap_shift: float = 5.0
    softcap_div: float = 7.5


def rms_norm(z: Tensor) -> Tensor:
    return z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + EPS)


def smear(e: Tensor, gate: Tensor, lam: Tensor, gc: int) -> Tensor:
    """C.1 step 1 / fwd 1: e'_t = e_t + lam sigmoid(e_t[0:gc] . w) e_{t-1} (un-smeared), t >= 1."""
    g = torch.sigmoid(e[:, 1:, :gc] @ gate.T)  # (B, T-1, 1), gate reads the token itself
    return torch.cat([e[:, :1], e[:, 1:] + lam * g * e[:, :-1]], dim=1)


def bigram_term(tokens: Tensor, bg: Tensor, sign: Tensor, s: ModelShape) -> Tensor:
    """fwd 2: hash and sign index restart at every row (= rank sequence); row rows-1 at t = 0."""
    cur, prev = tokens[:, 1:], tokens[:, :-1]
    h = ((HASH_CUR * cur) ^ (HASH_PREV * prev)) % (s.bigram_rows - 1)
    # fwd 2's position-1 quirk, in the record's own int32: x_0 read as the reserved row, the
    # product wrapping (an int32 tensor times a Python int stays int32), `%` taking the
    # divisor's sign. The sign row reads the real x_0.
    reserved = torch.tensor(s.bigram_rows - 1, dtype=torch.int32)
    h1 = ((HASH_CUR * cur[:, 0].int()) ^ (HASH_PREV * reserved)) % (s.bigram_rows - 1)
    h = torch.cat([h1[:, None].long(), h[:, 1:]], dim=1)
    sg = (prev ^ cur) % s.sign_rows
    h = torch.cat([torch.full_like(tokens[:, :1], s.bigram_rows - 1), h], dim=1)
    sg = torch.cat([torch.zeros_like(tokens[:, :1]), sg], dim=1)
    return bg[h] * sign[sg]  # (B, T, bigram_dim)


def rope_pairs(head_dim: int, mode: str) -> tuple[Tensor, Tensor]:
    """Attn 3: index pairs (a_j, b_j), j < D/4, rotated by frequency omega_j."""
    j = torch.arange(head_dim // 4)
    if mode == "interleaved":  # record_2026_07_17: adjacent dims (2j, 2j+1); D/2.. static
        return 2 * j, 2 * j + 1
    if mode == "half":  # record_2025_11_29: dim j with dim j + D/2
        return j, j + head_dim // 2
    raise ValueError(mode)


def rotate(z: Tensor, phase: Tensor, omega: Tensor, pairs: tuple[Tensor, Tensor]) -> Tensor:
    """Attn 3: z_a <- z_a cos + z_b sin, z_b <- z_b cos - z_a sin, theta = phase * omega.

    z (B, T, H, D); phase (T, H) position used for each (token, head)."""
    ia, ib = pairs
    theta = phase[..., None] * omega  # (T, H, D/4), float64 (no bf16 tables)
    cos, sin = torch.cos(theta), torch.sin(theta)
    a, b = z[..., ia], z[..., ib]
    out = z.clone()
    out[..., ia] = a * cos + b * sin
    out[..., ib] = b * cos - a * sin
    return out


def attention(
    p: dict,
    layer: int,
    u: Tensor,
    aux: Tensor | None,
    seg: Tensor,
    s: ModelShape,
    *,
    window: int,
    scale: float,
    omega: Tensor,
    pairing: str,
    rope: str,
) -> Tensor:
    """Attn_l(u; aux), D.1 Attn steps 1-9. u (B, T, d) normed input, aux (B, T, H, D) or None."""
    bsz, T, d = u.shape
    H, D = s.n_head, s.head_dim
    lam0, lam1 = p["scalars"][2 * layer], p["scalars"][2 * layer + 1]
    # Attn 1: lambda0 multiplies W_qkv (so it scales v; q, k only through the RMSNorm eps)
    q = (u @ (lam0 * p[f"W_q.{layer}"]).T).view(bsz, T, H, D)
    k = (u @ (lam0 * p[f"W_k.{layer}"]).T).view(bsz, T, H, D)
    v = (u @ (lam0 * p[f"W_v.{layer}"]).T).view(bsz, T, H, D)
    q, k = rms_norm(q), rms_norm(k)  # Attn 2: QK-norm per head
    paired = s.paired[layer] == "P"
    if paired and (s.key_offset[layer] == "K" or s.xsa[layer] == "X"):
        raise ValueError("Attn 5: paired layers have no key offset and no XSA")
    t = torch.arange(T, dtype=F64)[:, None]
    h = torch.arange(H)[None, :]
    if paired:  # Attn 5: doubled sequence, H/2 slots over 2T kernel positions
        half = H // 2
        if pairing == "h+H/2":  # record: position 2t holds heads 0..H/2-1, 2t+1 the rest
            slot, sub = h % half, h // half
        elif pairing == "adjacent":  # negative control: heads (2i, 2i+1) share slot i
            slot, sub = h // 2, h % 2
        else:
            raise ValueError(pairing)
        phase = 2 * t + (h % 2)  # rotated at 2t for even heads, 2t+1 for odd heads
        kpos = 2 * t + sub  # kernel position (windows and causality count these)
    else:
        slot, phase, kpos = h.expand(T, H), t.expand(T, H), t.expand(T, H)
    pairs = rope_pairs(D, rope)
    q, k = rotate(q, phase, omega, pairs), rotate(k, phase, omega, pairs)
    if s.key_offset[layer] == "K":  # Attn 4: k_t[D/2:] <- k_{t-1}[D/2:] (un-shifted, t >= 1)
        hi = torch.cat([k[:, :1, :, D // 2 :], k[:, :-1, :, D // 2 :]], dim=1)
        k = torch.cat([k[..., : D // 2], hi], dim=-1)
    if aux is not None:  # Attn 4/5: v <- v + aux (paired layers carry aux like v)
        v = v + aux
    # Attn 5/6: one softmax per query item (token i, head hq) over key items (token j, head hk):
    # same slot, kernel pos_k <= pos_q, same segment, pos_q - pos_k <= W (the kernel's mask).
    pos, grp = kpos.reshape(-1), slot.expand(T, H).reshape(-1)
    sgi = seg[:, :, None].expand(bsz, T, H).reshape(bsz, T * H)
    ok = (grp[:, None] == grp[None, :]) & (pos[None, :] <= pos[:, None])
    ok = ok & (pos[:, None] - pos[None, :] <= window)
    ok = ok[None] & (sgi[:, :, None] == sgi[:, None, :])
    qf, kf, vf = (x.reshape(bsz, T * H, D) for x in (q, k, v))
    scores = (scale * qf @ kf.transpose(1, 2)).masked_fill(~ok, float("-inf"))
    y = (torch.softmax(scores, dim=-1) @ vf).view(bsz, T, H, D)
    if s.xsa[layer] == "X":  # Attn 7: remove tanh(alpha_h) of the own-value direction
        vhat = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-4)
        alpha = torch.tanh(p["xsa_alphas"][layer]).view(1, 1, H, 1)
        y = y - alpha * (y * vhat).sum(-1, keepdim=True) * vhat
    gate = torch.sigmoid(u[..., : s.gate_channels] @ p[f"attn_gate.{layer}"].T)  # Attn 8
    y = y * gate[..., None]
    return y.reshape(bsz, T, d) @ (lam1 * p[f"W_o.{layer}"]).T  # Attn 9


def ve_aux(p: dict, layer: int, u: Tensor, ve: Tensor, s: ModelShape) -> Tensor:
    """VE gate: aux_h = 2 sigmoid([u[0:6], ve[0:6]] . G_ve[h]) * ve_h."""
    half = s.gate_channels // 2
    g = 2 * torch.sigmoid(torch.cat([u[..., :half], ve[..., :half]], -1) @ p[f"ve_gate.{layer}"].T)
    return g[..., None] * ve.view(*ve.shape[:2], s.n_head, s.head_dim)


def mlp(p: dict, layer: int, n: Tensor) -> Tensor:
    """MLP_l(n) = ReLU^2(n c_fc^T) c_proj; c_fc (out, in), c_proj stored (in, out)."""
    return torch.relu(n @ p[f"c_fc.{layer}"].T).pow(2) @ p[f"c_proj.{layer}"]


def mudd(p: dict, j: int, y: Tensor, n: int) -> Tensor:
    """MUDD_j(y) = 0.1 (GELU_erf(y W1_j^T) W2_j[0:n]^T + b2_j[0:n]), y un-normalised."""
    hid = F.gelu(y @ p["mudd_w1"][j].T)
    return 0.1 * (hid @ p["mudd_w2"][j, :n].T + p["mudd_b2"][j, :n])


def forward(
    params: dict[str, Tensor],
    tokens: Tensor,
    shape: ModelShape,
    *,
    window_short: int,
    window_long: int,
    attn_scale: float,
    bos: int,
    mtp_weights: list[float] | None,
    targets: Tensor | None = None,
    x0_quirk: bool = True,
    paired_pairing: str = "h+H/2",
    rope_pairing: str = "interleaved",
    rope_omega: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Softcapped logits (B, T, vocab) and the summed (MTP) training loss (None without targets).

    rope_omega: optional (head_dim/4,) frequencies (e.g. YaRN-rescaled, D.4); default base."""
    p, s = params, shape
    L, H, D, gc, bd = s.n_layer, s.n_head, s.head_dim, s.gate_channels, s.bigram_dim
    for name in ("attention", "paired", "window", "key_offset", "xsa", "value_table"):
        assert len(getattr(s, name)) == L, name
    last = L - 1
    assert s.attention[last] == "A" and s.c7 < last and s.skip_from < s.skip_to
    bsz, T = tokens.shape
    d = H * D
    sc = p["scalars"]
    if rope_omega is None:
        q4 = D // 4
        rope_omega = 1024.0 ** (-torch.arange(q4, dtype=F64) / (q4 - 1))  # Attn 3
    seg = torch.cumsum((tokens == bos).long(), dim=1)  # segment starts at every BOS; 0 before
    e = smear(p["E"][tokens], p["smear_gate"], sc[2 * L], gc)  # fwd 1
    bpad = F.pad(bigram_term(tokens, p["Bg"], p["S"], s), (0, d - bd))  # fwd 2, channels 0:bd
    lam_bg, lam_x0 = p["bigram_lambdas"], p["x0_lambdas"]
    x0 = rms_norm(e)  # fwd 3
    if x0_quirk:  # in-place add: x0 itself (hence c0, skip gate, x0 injections) holds the term
        x0 = x0 + lam_bg[0] * bpad
        x = x0
    else:  # pre-#83 behaviour: only the stream gets it
        x = x0 + lam_bg[0] * bpad
    c0 = x0
    ve = {c: p[f"VE.{c}"][tokens] for c in set(s.value_table) - {"."}}  # fwd 4, raw lookups
    g_skip = torch.sigmoid(sc[2 * L + 1]) * 2 * torch.sigmoid(x0[..., :gc] @ p["skip_gate"].T)
    attn_kw = {
        "seg": seg,
        "s": s,
        "scale": attn_scale,
        "omega": rope_omega,
        "pairing": paired_pairing,
        "rope": rope_pairing,
    }
    c_skip = c_back = c9 = None
    for layer in range(L):  # fwd 5
        r, q = p["resid_lambdas"][layer], p["post_lambdas"][layer]
        win = window_long if s.window[layer] == "L" else window_short
        table = s.value_table[layer]
        if layer == s.skip_to:  # x <- x + g_skip * c3 (no residual scaling)
            x = x + g_skip * c_skip
        if layer == last:  # MUDD block (replaces the layer's lambdas)
            c9 = x
            m = mudd(p, 0, x, 14)
            mi = [m[..., i : i + 1] for i in range(14)]
            v_mudd = mi[0] * c0 + mi[1] * c_back + mi[2] * x  # from the layer input
            x = (1 + mi[5]) * x + mi[3] * c0 + mi[4] * c_back
            aux = v_mudd.view(bsz, T, H, D)
            if table != ".":  # per-head VE gate (m6 for heads < H/2, m7 for the rest)
                g = torch.cat([mi[6].expand(-1, -1, H // 2), mi[7].expand(-1, -1, H - H // 2)], -1)
                aux = aux + g[..., None] * ve[table].view(bsz, T, H, D)
            u = rms_norm(c_back if layer > s.c7 else x)
            a = attention(p, layer, u, aux, window=win, **attn_kw)
            x = mi[8] * x + mi[9] * a + mi[10] * c0 + mi[11] * bpad
            x = mi[12] * x + mi[13] * mlp(p, layer, rms_norm(x))
        else:
            if s.attention[layer] == "A":
                u = rms_norm(c_back if layer > s.c7 else x)  # layers > c7 read RMSNorm(c7)
                aux = ve_aux(p, layer, u, ve[table], s) if table != "." else None
                a = attention(p, layer, u, aux, window=win, **attn_kw)
                x = r[0] * x + q[0] * a + lam_x0[layer] * x0  # injections after attention
                if layer >= 1:
                    x = x + lam_bg[layer] * bpad
            x = r[1] * x + q[1] * mlp(p, layer, rms_norm(x))  # MLP sublayer
        if layer == s.skip_from:
            c_skip = x
        if layer == s.c7:
            c_back = x
    n = mudd(p, 1, x, 5)  # fwd 6: post-loop MUDD; ve0 = raw lookup of table 0
    ve0 = ve["0"] if "0" in ve else p["VE.0"][tokens]
    x = x + n[..., 0:1] * c0 + n[..., 1:2] * c_back + n[..., 2:3] * c9
    x = x + n[..., 3:4] * ve0 + n[..., 4:5] * c_skip
    z = rms_norm(x) @ p["W_head"].T
    logits = s.softcap * torch.sigmoid((z + s.softcap_shift) / s.softcap_div)  # D.2 softcap
    if targets is None:
        return logits, None
    weights = [1.0] if mtp_weights is None else mtp_weights
    lse = torch.logsumexp(logits, dim=-1)  # D.2: lse over the capped logits
    loss = logits.new_zeros(())
    for k, w in enumerate(weights):  # D.2: terms with i + k >= T dropped, sum reduction
        if k >= T:
            break
        picked = logits[:, : T - k].gather(-1, targets[:, k:, None]).squeeze(-1)
        loss = loss + w * (lse[:, : T - k] - picked).sum()
    return logits, loss
