"""Independent float64 reference of record_medium_2025_12_31's model forward pass and losses.

Follows only the record's description in docs/records.md, record_medium_2025_12_31: M.1 (forward
steps 1-7, Attn steps 1-8, MLP), M.2 (softcap and losses), M.10 and M.11, with the steps M.1 takes
from record_2025_11_29 (C.1 forward step 2 smear, C.1 Attn steps 3, 5 and 6: half-truncated rotary,
document/window mask, sparse gate) and record_2026_07_17 (D.1 forward step 4 skip gate, D.1 Attn
steps 1, 4 and 9), and the shared parameter-free RMSNorm with eps = 2^-23. Nothing of the project is
imported.

Exact math: float64 everywhere; the bf16 parameters, bf16 activations, bf16 rotary tables and bf16
capped logits of M.1/M.2 are deliberately absent (those roundings are tested elsewhere). Every input
tensor is cast to float64 on entry.

Parameters: a dict keyed by the record's own script names with the record's storage shapes (M.1
parameter table), for a model of ``shape.n_layer`` layers and width d = n_head * head_dim:
``lm_head.weight``, ``embed.weight``, ``embed2.weight``, ``value_embeds.{i}.weight`` (V, d);
``blocks.{l}.attn.qkvo_w`` (4d, d) = [W_q; W_k; W_v; W_o] as (out, in) row blocks;
``blocks.{l}.mlp.c_fc`` (4d, d) (out, in); ``blocks.{l}.mlp.c_proj`` (4d, d) (in, out);
``blocks.{l}.attn.attn_gate.weight`` (n_head, G); ``blocks.{l}.attn.value_embed_gate.weight``
(n_head, G) in the layers with a value table; ``smear_gate.weight`` (1, G);
``skip_gates.{k}.weight`` (1, G); ``x0_lambdas`` (2 n_layer,) viewed (n_layer, 2) row-major
(Lambda[l, 0] weights x0, Lambda[l, 1] weights x02); ``scalars`` (the sigma vector).

Scalar vector, M.1's sigma table generalised to L = n_layer layers and K = len(skips) skips:
r_l at l; (lambda0_l, lambda1_l) at L + 2l, L + 2l + 1; lambda_smear at 3L; lambda_back at 3L + 1;
skip logit w_k at 3L + 2 + k; any padding after it is unused.

Per-layer layout (M.1 per-layer table) comes from the shape's strings, one character per layer:
``window`` ("L" long window with key offset, "S" short) and ``value_table`` (table index or ".").
Skip k = ``skips[k]`` = (source layer, target layer) uses gate ``skip_gates.k`` and logit w_k.

Rotary, generalised to head_dim D (M.1 Attn step 3 = C.1 Attn step 3): each head splits into the
halves z1 = z[0:D/2], z2 = z[D/2:D]; pair j (j < D/2) rotates z1_j, z2_j by theta = t * omega_j as
z1_j <- z1_j cos + z2_j sin, z2_j <- -z1_j sin + z2_j cos, with omega_j = 1024^(-j / (D/4 - 1)) for
j = 0 ... D/4 - 1 and omega_j = 0 for j = D/4 ... D/2 - 1 (for D = 128: 1024^(-j/31), j < 32), and
t the packed position within the row. The key offset (M.1 Attn step 4) shifts exactly the dims
whose base frequency is 0: D/4 ... D/2 - 1 and 3D/4 ... D - 1 (for D = 128: 32-63 and 96-127).
A caller's ``freqs`` (YaRN-rescaled omega) replaces omega as given; the key-offset dims stay those
fixed dims.

Misreadings (negative controls; each changes only the one thing named):

- ``"key_offset_second_half"``: the key offset shifts dims D/2 ... D - 1 (record_2026_07_17's
  dims for its interleaved rotary) instead of the zero-frequency dims.
- ``"value_gate_reads_ve"``: the value-embedding gate reads record_2026_07_17's input
  [u[0:G/2], ve[0:G/2]] instead of u[0:G].
- ``"skips_reversed"``: the saved skip sources are paired with the targets in reverse order (for
  the record 2 -> 9, 4 -> 10, 6 -> 11); gate k and logit w_k stay with the k-th target.
- ``"no_x02"``: the second embedding's term Lambda[l, 1] * x02 is dropped.
- ``"untied"``: the input embedding reads ``embed.weight`` although ``tied=True``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Tensor = torch.Tensor
F64 = torch.float64
EPS = 2.0**-23  # docs/records.md, shared conventions: parameter-free RMSNorm, eps = 2^-23

MISREADINGS = frozenset(
    {"key_offset_second_half", "value_gate_reads_ve", "skips_reversed", "no_x02", "untied"}
)


@dataclass
class ModelShape:
    n_layer: int = 16
    n_head: int = 8
    head_dim: int = 128
    vocab: int = 50304
    gate_channels: int = 16  # G: smear, skip, attention and VE gates read the first G channels
    window: str = "LSSSLSSSSSSLSSSL"  # per layer: L long window (+ key offset), S short
    value_table: str = "01234......01234"  # per layer: value table index, "." none
    skips: tuple[tuple[int, int], ...] = ((6, 9), (4, 10), (2, 11))  # (source, target) per skip
    backout_layer: int = 11
    softcap: float = 23.0
    softcap_shift: float = 5.0
    softcap_div: float = 7.5
    bos: int = 50256


@dataclass(frozen=True)
class _Run:
    """The per-call settings shared by every layer."""

    seg: Tensor  # (B, T) segment id of each position
    long_window: int
    short_window: int
    attn_scale: float
    freqs: Tensor  # (D/2,) half-head frequencies omega
    misreading: str | None


def rms_norm(z: Tensor) -> Tensor:
    """Shared conventions: z / sqrt(mean(z^2) + 2^-23) over the last dim, no gain."""
    return z / torch.sqrt(z.pow(2).mean(-1, keepdim=True) + EPS)


def base_freqs(head_dim: int) -> Tensor:
    """M.1 Attn step 3: omega_j = 1024^(-j/(D/4-1)) for j < D/4, 0 for D/4 <= j < D/2."""
    q = head_dim // 4
    live = 1024.0 ** (-torch.arange(q, dtype=F64) / (q - 1))
    return torch.cat([live, torch.zeros(head_dim // 2 - q, dtype=F64)])


def segments(tokens: Tensor, bos: int) -> Tensor:
    """M.1 Attn step 6 (C.1 Attn step 5): a segment starts at every BOS and at each row's start."""
    return torch.cumsum((tokens == bos).long(), dim=1)


def embed(p: dict[str, Tensor], tokens: Tensor, tied: bool, misreading: str | None) -> Tensor:
    """M.1 forward step 1: e = W_head[tokens] while tied, E[tokens] after the split (raw rows)."""
    untied = not tied or misreading == "untied"
    return p["embed.weight" if untied else "lm_head.weight"][tokens]


def smear(e: Tensor, gate: Tensor, lam: Tensor, gc: int) -> Tensor:
    """M.1 forward step 2: e'_t = e_t + lam_smear sigma(e_t[0:G] w^T) e_{t-1}, t >= 1."""
    g = torch.sigmoid(e[:, 1:, :gc] @ gate.T)  # (B, T-1, 1): the token's own channels
    return torch.cat([e[:, :1], e[:, 1:] + lam * g * e[:, :-1]], dim=1)  # un-smeared e_{t-1}


def input_streams(e_smeared: Tensor, e2: Tensor) -> tuple[Tensor, Tensor]:
    """M.1 forward step 3: x0 = RMSNorm(e'), x02 = RMSNorm(E2[tokens])."""
    return rms_norm(e_smeared), rms_norm(e2)


def skip_gate(x0: Tensor, gate: Tensor, logit: Tensor, gc: int) -> Tensor:
    """M.1 forward step 4: gamma_k,t = sigma(w_k) 2 sigma(x0_t[0:G] g_k^T), shape (B, T, 1)."""
    return torch.sigmoid(logit) * 2 * torch.sigmoid(x0[..., :gc] @ gate.T)


def qkv(u: Tensor, qkvo: Tensor, lam0: Tensor, s: ModelShape) -> tuple[Tensor, Tensor, Tensor]:
    """M.1 Attn step 1: [q | k | v] = u (lambda0 W_qkv)^T, W_qkv = rows 0 ... 3d-1 of P."""
    bsz, T, d = u.shape
    out = u @ (lam0 * qkvo[: 3 * d]).T
    q, k, v = out.split(d, dim=-1)
    return tuple(z.reshape(bsz, T, s.n_head, s.head_dim) for z in (q, k, v))


def qk_norm(q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """M.1 Attn step 2: QK-norm, RMSNorm over each head's D dims."""
    return rms_norm(q), rms_norm(k)


def rotary(z: Tensor, freqs: Tensor) -> Tensor:
    """M.1 Attn step 3: half-truncated rotary at packed position t (C.1 Attn step 3's signs)."""
    T, half = z.shape[1], z.shape[-1] // 2
    theta = torch.arange(T, dtype=F64)[:, None] * freqs  # (T, D/2)
    cos, sin = torch.cos(theta)[:, None], torch.sin(theta)[:, None]  # broadcast over heads
    z1, z2 = z[..., :half], z[..., half:]
    return torch.cat([z1 * cos + z2 * sin, -z1 * sin + z2 * cos], dim=-1)


def offset_dims(head_dim: int, misreading: str | None) -> Tensor:
    """M.1 Attn step 4: the zero-frequency dims D/4 ... D/2-1 and 3D/4 ... D-1 of each head."""
    if misreading == "key_offset_second_half":
        return torch.arange(head_dim // 2, head_dim)
    q = head_dim // 4
    return torch.cat([torch.arange(q, 2 * q), torch.arange(3 * q, head_dim)])


def key_offset(k: Tensor, dims: Tensor) -> Tensor:
    """M.1 Attn step 4: k_t[c] <- k_{t-1}[c] for t >= 1 from the un-shifted keys, k_0 unchanged."""
    out = k.clone()
    out[:, 1:, :, dims] = k[:, :-1, :, dims]  # reads the original k: a shift, across documents
    return out


def value_embed(
    v: Tensor, u: Tensor, ve: Tensor, gate: Tensor, gc: int, misreading: str | None
) -> Tensor:
    """M.1 Attn step 5: v_h <- v_h + 2 sigma(u[0:G] G_ve[h]^T) ve_h, ve reshaped to heads."""
    if misreading == "value_gate_reads_ve":  # record_2026_07_17's gate input [u[0:G/2], ve[0:G/2]]
        half = gc // 2
        gin = torch.cat([u[..., :half], ve[..., :half]], dim=-1)
    else:
        gin = u[..., :gc]
    g = 2 * torch.sigmoid(gin @ gate.T)  # (B, T, H)
    return v + g[..., None] * ve.reshape(v.shape)


def attend(q: Tensor, k: Tensor, v: Tensor, seg: Tensor, window: int, scale: float) -> Tensor:
    """M.1 Attn step 6: softmax(s_attn q k^T) v over j <= i, same segment, i - j <= W."""
    T = q.shape[1]
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    ok = (j <= i) & (i - j <= window)  # (T, T)
    ok = ok[None] & (seg[:, :, None] == seg[:, None, :])  # (B, T, T)
    scores = scale * torch.einsum("bihd,bjhd->bhij", q, k)
    scores = scores.masked_fill(~ok[:, None], float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, dim=-1), v)


def sparse_gate(y: Tensor, u: Tensor, gate: Tensor, gc: int) -> Tensor:
    """M.1 Attn step 7: y_h <- y_h sigma(u[0:G] G[h]^T)."""
    return y * torch.sigmoid(u[..., :gc] @ gate.T)[..., None]


def attn_output(y: Tensor, qkvo: Tensor, lam1: Tensor) -> Tensor:
    """M.1 Attn step 8: concat(y) (lambda1 W_o)^T, W_o = rows 3d ... 4d-1 of P."""
    bsz, T, H, D = y.shape
    d = H * D
    return y.reshape(bsz, T, d) @ (lam1 * qkvo[3 * d :]).T


def attn(
    p: dict[str, Tensor], layer: int, u: Tensor, ve: Tensor | None, s: ModelShape, run: _Run
) -> Tensor:
    """M.1 Attn_l(u), steps 1-8; u = RMSNorm of the layer's stream, ve the raw lookup or None."""
    L, gc = s.n_layer, s.gate_channels
    pre = f"blocks.{layer}.attn."
    qkvo = p[pre + "qkvo_w"]
    lam0, lam1 = p["scalars"][L + 2 * layer], p["scalars"][L + 2 * layer + 1]
    q, k, v = qkv(u, qkvo, lam0, s)
    q, k = qk_norm(q, k)
    q, k = rotary(q, run.freqs), rotary(k, run.freqs)
    long = s.window[layer] == "L"
    if long:
        k = key_offset(k, offset_dims(s.head_dim, run.misreading))
    if ve is not None:
        v = value_embed(v, u, ve, p[pre + "value_embed_gate.weight"], gc, run.misreading)
    window = run.long_window if long else run.short_window
    y = attend(q, k, v, run.seg, window, run.attn_scale)
    y = sparse_gate(y, u, p[pre + "attn_gate.weight"], gc)
    return attn_output(y, qkvo, lam1)


def mlp(p: dict[str, Tensor], layer: int, n: Tensor) -> Tensor:
    """M.1 MLP_l(n) = ReLU^2(n C_fc^T) C_proj; C_fc stored (out, in), C_proj stored (in, out)."""
    pre = f"blocks.{layer}.mlp."
    return torch.relu(n @ p[pre + "c_fc"].T).pow(2) @ p[pre + "c_proj"]


def residual_mix(
    p: dict[str, Tensor], layer: int, x: Tensor, x0: Tensor, x02: Tensor, s: ModelShape, run: _Run
) -> Tensor:
    """M.1 forward step 5: x <- r_l x + Lambda[l,0] x0 + Lambda[l,1] x02 (after the skip)."""
    lam = p["x0_lambdas"].view(s.n_layer, 2)[layer]
    out = p["scalars"][layer] * x + lam[0] * x0
    if run.misreading != "no_x02":
        out = out + lam[1] * x02
    return out


def block(
    p: dict[str, Tensor],
    layer: int,
    x: Tensor,
    x0: Tensor,
    x02: Tensor,
    skip_in: list[tuple[Tensor, Tensor]],
    ve: Tensor | None,
    s: ModelShape,
    run: _Run,
) -> Tensor:
    """M.1 forward step 5, one layer: skips added first, then the mix, Attn and MLP."""
    for gamma, saved in skip_in:
        x = x + gamma * saved
    x = residual_mix(p, layer, x, x0, x02, s, run)
    x = x + attn(p, layer, rms_norm(x), ve, s, run)
    return x + mlp(p, layer, rms_norm(x))


def backout(x: Tensor, x_back: Tensor, lam_back: Tensor) -> Tensor:
    """M.1 forward step 6: x <- x - lambda_back x_back."""
    return x - lam_back * x_back


def head(x: Tensor, w_head: Tensor) -> Tensor:
    """M.1 forward step 7: z = RMSNorm(x) W_head^T."""
    return rms_norm(x) @ w_head.T


def softcap(z: Tensor, s: ModelShape) -> Tensor:
    """M.2: c(z) = softcap sigma((z + shift) / div) (23 sigma((z + 5)/7.5) in the record)."""
    return s.softcap * torch.sigmoid((z + s.softcap_shift) / s.softcap_div)


def skip_pairs(s: ModelShape, misreading: str | None) -> list[tuple[int, int]]:
    """M.1 forward step 5: (source, target) of skip k; the misreading reverses the sources."""
    sources = [src for src, _ in s.skips]
    if misreading == "skips_reversed":
        sources = sources[::-1]
    return [(src, tgt) for src, (_, tgt) in zip(sources, s.skips, strict=True)]


def _check(s: ModelShape, misreading: str | None) -> None:
    L = s.n_layer
    if misreading is not None and misreading not in MISREADINGS:
        raise ValueError(f"unknown misreading {misreading!r}; known: {sorted(MISREADINGS)}")
    if len(s.window) != L or set(s.window) - {"L", "S"}:
        raise ValueError(f"window {s.window!r} must give S or L for each of {L} layers")
    if len(s.value_table) != L:
        raise ValueError(f"value_table {s.value_table!r} must have {L} characters")
    for src, tgt in skip_pairs(s, misreading):
        if not 0 <= src < tgt < L:
            raise ValueError(f"skip {src} -> {tgt} must go forward within {L} layers")
    if not 0 <= s.backout_layer < L:
        raise ValueError(f"backout_layer {s.backout_layer} outside {L} layers")
    if s.head_dim % 4 or s.head_dim < 8 or s.gate_channels > s.n_head * s.head_dim:
        raise ValueError("head_dim must be a multiple of 4 (>= 8) and gate_channels <= d")


def logits(
    params: dict[str, Tensor],
    tokens: Tensor,
    shape: ModelShape,
    *,
    long_window: int,
    short_window: int,
    attn_scale: float,
    freqs: Tensor | None = None,
    tied: bool = True,
    misreading: str | None = None,
) -> Tensor:
    """Softcapped logits (B, T, V) in float64; each row of tokens (B, T) is one packed sequence.

    M.1 forward steps 1-7 and M.2's softcap. Windows are in tokens (query i sees key j iff j <= i,
    same segment, i - j <= W); freqs optionally replaces the (D/2,) base frequencies."""
    s = shape
    _check(s, misreading)
    p = {name: t.to(F64) for name, t in params.items()}
    tokens = tokens.long()
    L, gc, K = s.n_layer, s.gate_channels, len(s.skips)
    sc = p["scalars"]
    run = _Run(
        seg=segments(tokens, s.bos),
        long_window=long_window,
        short_window=short_window,
        attn_scale=attn_scale,
        freqs=base_freqs(s.head_dim) if freqs is None else freqs.to(F64),
        misreading=misreading,
    )
    e = embed(p, tokens, tied, misreading)  # step 1
    ve = {c: p[f"value_embeds.{c}.weight"][tokens] for c in set(s.value_table) - {"."}}
    e = smear(e, p["smear_gate.weight"], sc[3 * L], gc)  # step 2
    x0, x02 = input_streams(e, p["embed2.weight"][tokens])  # step 3
    gammas = [skip_gate(x0, p[f"skip_gates.{k}.weight"], sc[3 * L + 2 + k], gc) for k in range(K)]
    pairs = skip_pairs(s, misreading)
    sources = {src for src, _ in pairs}
    saved: dict[int, Tensor] = {}
    x = x0
    for layer in range(L):  # step 5
        skip_in = [(gammas[k], saved[src]) for k, (src, tgt) in enumerate(pairs) if tgt == layer]
        table = s.value_table[layer]
        x = block(p, layer, x, x0, x02, skip_in, None if table == "." else ve[table], s, run)
        if layer in sources or layer == s.backout_layer:
            saved[layer] = x
    x = backout(x, saved[s.backout_layer], sc[3 * L + 1])  # step 6
    return softcap(head(x, p["lm_head.weight"]), s)  # step 7, M.2


def training_loss(
    params: dict[str, Tensor],
    tokens: Tensor,
    targets: Tensor,
    mtp_weights: list[float] | tuple[float, ...],
    shape: ModelShape,
    **kwargs,
) -> Tensor:
    """M.2 training loss: sum over rows, positions i and k of w_k (lse_i - c_i[y_{i+k}]), i+k < T.

    Document boundaries are ignored; y_j = targets[:, j]; keyword arguments as for logits."""
    c = logits(params, tokens, shape, **kwargs)
    targets = targets.long()
    T = c.shape[1]
    lse = torch.logsumexp(c, dim=-1)  # (B, T), over the capped logits
    loss = c.new_zeros(())
    for k, w in enumerate(mtp_weights):
        if k >= T:
            break
        picked = c[:, : T - k].gather(-1, targets[:, k:, None]).squeeze(-1)
        loss = loss + float(w) * (lse[:, : T - k] - picked).sum()
    return loss


def eval_loss(
    params: dict[str, Tensor], tokens: Tensor, targets: Tensor, shape: ModelShape, **kwargs
) -> Tensor:
    """M.2 evaluation loss: next-token cross-entropy of the capped logits, mean over all tokens."""
    c = logits(params, tokens, shape, **kwargs)
    lse = torch.logsumexp(c, dim=-1)
    picked = c.gather(-1, targets.long()[..., None]).squeeze(-1)
    return (lse - picked).mean()
