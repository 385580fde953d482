"""Milliseconds from a ledger (scripts/gpu_dryrun/ledger.py): a roofline per launch, with three
constants fitted to the steps measured on GPUs (scripts/gpu_dryrun/calibrate.py, docs/ledger.md).

Each launch takes max(FLOPs / (f · peak of its dtype), bytes / (b · HBM bandwidth)) + a fixed
cost L per launch; each collective of the optimizer, its bytes per rank over the NVLink
bandwidth, added (the optimizer waits for each exchange before the update that needs it);
DDP's all-reduce of the other gradients, booked to the backward, is taken as hidden under it
(DDP launches each bucket's all-reduce as the backward fills it). The
constants are f (the share of the peak FLOP rate the products reach), b (the share of the HBM
bandwidth the kernels reach) and L; the GPUs' peaks are their datasheets' (dense, no sparsity).
"""

import math
from dataclasses import dataclass

import numpy as np

from scripts.gpu_dryrun.ledger import Ledger


@dataclass(frozen=True)
class Gpu:
    name: str
    peak: dict[str, float]  # FLOP/s by dtype class (dense)
    hbm: float  # bytes/s
    nvlink: float  # bytes/s per direction


_PEAK = {"fp8": 1978.9e12, "bf16": 989.4e12, "fp32": 66.9e12}
GPUS = {
    "H100": Gpu("H100 SXM", _PEAK, 3.35e12, 450e9),
    "H200": Gpu("H200 SXM", _PEAK, 4.8e12, 450e9),
}


@dataclass(frozen=True)
class Constants:
    flop_share: float  # f
    bandwidth_share: float  # b
    launch_us: float  # L

    def __str__(self) -> str:
        return (f"f = {self.flop_share:.2f} of peak FLOP/s, b = {self.bandwidth_share:.2f} of HBM "
                f"bandwidth, L = {self.launch_us:.1f} µs per launch")  # fmt: skip


def dtype_class(dtype: str) -> str:
    """A product's operand dtype as a peak: FP8, bf16 (and fp16; a Triton kernel's stated
    FLOPs, whose dtype is not stated, are taken as bf16), fp32 (no TF32: this project leaves
    torch's float32 matmul precision at its default, "highest")."""
    d = dtype.lower()
    if "float8" in d:
        return "fp8"
    if d in ("float", "float32", "double", "float64"):
        return "fp32"
    return "bf16"


@dataclass(frozen=True)
class Terms:
    """A ledger reduced to what the estimate needs: per launch, its seconds at full peak
    FLOP rate and at full bandwidth; the launch count; the collectives' seconds."""

    flop_s: np.ndarray
    byte_s: np.ndarray
    launches: int
    wire_s: float

    @staticmethod
    def of(ledger: Ledger, gpu: Gpu) -> "Terms":
        flop, byte, n, wire = [], [], 0, 0.0
        for x in ledger.launches:
            if x.source == "collective":
                if x.phase != "backward":  # DDP's all-reduce runs under the backward
                    wire += x.bytes / gpu.nvlink
                continue
            flop.append(x.flops / gpu.peak[dtype_class(x.dtype)])
            byte.append(x.bytes / gpu.hbm)
            n += x.launches
        return Terms(np.array(flop), np.array(byte), n, wire)

    def seconds(self, c: Constants) -> float:
        work = np.maximum(self.flop_s / c.flop_share, self.byte_s / c.bandwidth_share).sum()
        return float(work + self.launches * c.launch_us * 1e-6 + self.wire_s)


def estimate_ms(ledger: Ledger, gpu: str, c: Constants) -> float:
    return Terms.of(ledger, GPUS[gpu]).seconds(c) * 1e3


@dataclass(frozen=True)
class Row:
    """A measured step: its ledger's terms on the GPU it ran on, and its ms."""

    name: str
    terms: Terms
    measured_ms: float


COARSE = np.linspace(0.05, 1.0, 20)  # f and b: a coarse grid, then a finer one around its best
LAUNCH_US = np.linspace(0.0, 40.0, 401)  # L's grid (0.1 µs)


def fit(rows: list[Row]) -> Constants:
    """The constants that minimise the mean squared log ratio of estimate to measurement:
    f and b searched on a grid of shares (0.05 apart, then 0.01 around the best), L (≥ 0)
    on a grid of 0.1 µs for each pair."""
    best = _search(rows, COARSE, COARSE)
    fine = np.arange(-5, 5.5) * 0.01
    f = np.clip(best[1].flop_share + fine, 0.01, 1.0)
    b = np.clip(best[1].bandwidth_share + fine, 0.01, 1.0)
    return _search(rows, f, b)[1]


def _search(rows: list[Row], fs: np.ndarray, bs: np.ndarray) -> tuple[float, Constants]:
    measured = np.array([r.measured_ms * 1e-3 for r in rows])
    launches = np.array([r.terms.launches for r in rows], dtype=float)
    best: tuple[float, Constants] = (math.inf, Constants(1.0, 1.0, 0.0))
    for f in fs:
        for b in bs:
            work = np.array([
                np.maximum(r.terms.flop_s / f, r.terms.byte_s / b).sum() + r.terms.wire_s
                for r in rows
            ])  # fmt: skip
            # rows × L: each row's log ratio at each L
            ratio = (work[:, None] + launches[:, None] * LAUNCH_US[None, :] * 1e-6) / measured[
                :, None
            ]
            err = (np.log(ratio) ** 2).mean(axis=0)
            i = int(np.argmin(err))
            if err[i] < best[0]:
                best = (float(err[i]), Constants(float(f), float(b), float(LAUNCH_US[i])))
    return best


def leave_one_out(rows: list[Row]) -> list[tuple[Row, float]]:
    """Each row's estimate (ms) from constants fitted to the others."""
    out = []
    for i, r in enumerate(rows):
        c = fit(rows[:i] + rows[i + 1 :])
        out.append((r, r.terms.seconds(c) * 1e3))
    return out
