"""A mixture-of-experts ReLU² MLP (model.mlp.experts = E ≥ 2), in place of the dense MLP.

For each token u (RMSNorm'd, d wide), with router weight R (E, d) and the expert stacks
W_fc (E, h, d) and W_proj (E, d, h):

    p = softmax(R·u) in fp32                 the router's probabilities over the E experts
    S = the top_k experts of p               (torch.topk)
    g_e = p_e / Σ_{e'∈S} p_e'   (e ∈ S)      the gates, renormalised over the chosen
    MoE(u) = Σ_{e∈S} g_e · W_proj[e]·relu(W_fc[e]·u)²

The experts' weights are stacks, one (out, in) matrix per expert, so that Muon
orthogonalises each expert on its own with the LR scale of one expert's shape
(`optim.muon.expert_keys` names them; optim/muon/optimizer.py). h is model.mlp.expert_hidden,
by default 4·d / top_k: a token then meets as many MLP weights as in the dense MLP.

Load balancing (model.mlp.balance = α): the Switch Transformer's term
α·E·Σₑ fₑ·Pₑ over one forward's tokens, fₑ the share of the N·top_k routed slots that went to
e and Pₑ the mean of pₑ; it is 1·α when the load is even. Its gradient joins the backward
(`_AddBalance`) without entering the loss the forward returns, so training and validation
report the same cross-entropy. Only Pₑ carries a gradient (the choice does not).

Each expert computes on the tokens routed to it (a gather, two matmuls and a scatter-add per
expert): E small matmuls of varying length, not a grouped GEMM, and a compiled forward sees
data-dependent shapes. Expert parallelism (tokens sent to the rank holding their expert) is
not built: every rank holds every expert.
"""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.layers import declare, linear


def expert_hidden(cfg: ModelConfig) -> int:
    """h: model.mlp.expert_hidden, or 4·n_embd // top_k where it is 0."""
    mlp = cfg.mlp
    return mlp.expert_hidden or 4 * cfg.n_embd // mlp.top_k


class _AddBalance(torch.autograd.Function):
    """Returns `out` unchanged; in the backward, `term` receives the gradient 1 (so its own
    gradient reaches the router as if `term` were added to the loss)."""

    @staticmethod
    def forward(ctx, out: Tensor, term: Tensor) -> Tensor:  # type: ignore[override]
        ctx.term_shape, ctx.term_dtype = term.shape, term.dtype
        return out.view_as(out)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        return grad, torch.ones(ctx.term_shape, dtype=ctx.term_dtype, device=grad.device)


class Experts(nn.Module):
    """E expert MLPs as two stacks: `fc` (E, h, d) and `proj` (E, d, h), each expert's
    matrices (out, in) as `nn.Linear` stores them. Only top_k / E of them act on a token
    (`active_share`, which the FLOP count reads: model/flops.py)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        e, d, h = cfg.mlp.experts, cfg.n_embd, expert_hidden(cfg)
        self.fc = nn.Parameter(torch.empty(e, h, d))
        self.proj = nn.Parameter(torch.empty(e, d, h))
        for p in (self.fc, self.proj):
            declare(p, "matrix")
            p.active_share = cfg.mlp.top_k / e  # type: ignore[attr-defined]


class MoE(nn.Module):
    """The mixture (module docstring): `router` (E × d, an `nn.Linear` of the model's kind)
    and `experts`. Called as `MLP` is, on the RMSNorm'd stream."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        mlp = cfg.mlp
        self.n_experts, self.top_k, self.balance = mlp.experts, mlp.top_k, mlp.balance
        self.router = linear(cfg, cfg.n_embd, mlp.experts)
        self.experts = Experts(cfg)

    @torch.no_grad()
    def reset(self, bound: float) -> None:
        """The router and each expert's fc uniform in ±`bound` (the dense fc's), the experts'
        proj zero: every layer starts as the identity, as with the dense MLP."""
        nn.init.uniform_(self.router.weight, -bound, bound)
        nn.init.uniform_(self.experts.fc, -bound, bound)
        nn.init.zeros_(self.experts.proj)

    def matrices(self) -> list[nn.Parameter]:
        """The router and the two stacks (model.numerics.bf16_matrices casts them)."""
        return [self.router.weight, self.experts.fc, self.experts.proj]

    def route(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(probabilities (N, E) fp32, chosen experts (N, k), gates (N, k) fp32) of the
        tokens `u` (N, d)."""
        probs = self.router(u).float().softmax(-1)
        top, chosen = probs.topk(self.top_k, dim=-1)
        return probs, chosen, top / top.sum(-1, keepdim=True)

    def balance_term(self, probs: Tensor, chosen: Tensor) -> Tensor:
        """α·E·Σₑ fₑ·Pₑ (module docstring), a 0-d fp32 tensor."""
        counts = torch.bincount(chosen.flatten(), minlength=self.n_experts)
        share = counts.to(probs.dtype) / chosen.numel()
        return self.balance * self.n_experts * (share * probs.mean(0)).sum()

    def forward(self, x: Tensor, micro_steps: int = 1) -> Tensor:
        """`micro_steps`: the update's gradient accumulation; the balance term's gradient is
        divided by it, as each micro-step's loss is."""
        shape = x.shape
        u = x.reshape(-1, shape[-1])
        probs, chosen, gates = self.route(u)
        out = torch.zeros_like(u)
        fc, proj = self.experts.fc.to(u.dtype), self.experts.proj.to(u.dtype)
        experts = chosen.flatten()  # slot s = (token s // k, its choice s % k)
        order = torch.argsort(experts, stable=True)  # the slots by expert, in token order
        counts = torch.bincount(experts, minlength=self.n_experts).tolist()  # a host sync
        for e, group in enumerate(order.split(counts)):
            if not len(group):
                continue
            rows = group // self.top_k
            h = F.relu(u[rows] @ fc[e].T).square() @ proj[e].T
            weighted = h * gates.flatten()[group].unsqueeze(-1).to(h.dtype)
            out.index_add_(0, rows, weighted.to(out.dtype))  # autocast's h may be bf16
        out = out.view(shape)
        if self.training and self.balance and torch.is_grad_enabled():
            out = _AddBalance.apply(out, self.balance_term(probs, chosen) / micro_steps)
        return out
