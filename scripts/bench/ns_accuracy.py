"""Accuracy probes of the Newton–Schulz lab (scripts/bench/ns.py): Gaussian and gradient-like
inputs per shape class, with their fp64 polar factors computed once."""

from collections.abc import Callable

import torch

from optim.muon.optimizer import Muon


def polar(G: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    return U @ Vh


def gradient_like(k: int, m: int, n: int, gen: torch.Generator) -> torch.Tensor:
    """k m×n matrices U·diag(s)·Vᵀ with s log-uniform in [0.01, 1] and random orthogonal U, V."""
    r = min(m, n)
    U = torch.linalg.qr(torch.randn(k, m, r, generator=gen, dtype=torch.float64))[0]
    V = torch.linalg.qr(torch.randn(k, n, r, generator=gen, dtype=torch.float64))[0]
    s = 10 ** (-2 * torch.rand(k, r, generator=gen, dtype=torch.float64))
    return ((U * s.unsqueeze(1)) @ V.mT).float()


class Probes:
    """Accuracy inputs per shape class, with their fp64 references computed once."""

    def __init__(self, stacks: list[torch.Tensor], per_class: int, seed: int = 1) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.gauss = [torch.randn(per_class, *s.shape[1:], generator=gen) for s in stacks]
        self.gauss_polar = [polar(g) for g in self.gauss]
        self.grads = [gradient_like(per_class, *s.shape[1:], gen) for s in stacks]
        self.grads_polar = [polar(g) for g in self.grads]

    def accuracy(self, run: Callable, device: torch.device) -> dict[str, float]:
        outs = [o.double().cpu() for o in run([g.to(device) for g in self.gauss])]
        lo, hi, orth, pol = float("inf"), 0.0, 0.0, 0.0
        for o, p in zip(outs, self.gauss_polar, strict=True):
            sv = torch.linalg.svdvals(o)
            hi = max(hi, sv.max().item())
            pol = max(pol, ((o - p).norm() / p.norm()).item())
            m, n = o.shape[-2:]
            if m < n:
                lo = min(lo, sv.min().item())
                eye = torch.eye(m, dtype=o.dtype)
                orth = max(orth, ((o @ o.mT - eye).norm(dim=(-2, -1)) / m**0.5).max().item())
        return {"sv_min": lo, "sv_max": hi, "orth": orth, "polar": pol}

    def muon_error(self, settings: dict, dtype: torch.dtype, device: torch.device) -> float:
        """One optim.Muon step with these Newton–Schulz `settings` (MuonConfig fields) in
        `dtype` against the same step with the exact U·Vᵀ."""
        worst = 0.0
        for g, p in zip(self.grads, self.grads_polar, strict=True):
            for gi, pi in zip(g, p, strict=True):
                param = torch.zeros_like(gi, device=device, requires_grad=True)
                param.grad = gi.to(device)
                opt = Muon([param], lr=1.0, lr_scale="none", ns_dtype=dtype, **settings)
                opt.step()  # first step: the update is a multiple of the gradient itself
                change = param.detach().double().cpu()
                worst = max(worst, ((change + pi).norm() / pi.norm()).item())
        return worst
