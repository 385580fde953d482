"""`model.head`: the LM head and its loss."""

from dataclasses import dataclass, field

from model.config.renamed import check_renamed
from stages.moved import refuse_moved

SOFTCAP_FORMS = ("tanh", "sigmoid")
LOSSES = ("auto", "fused", "plain", "sigmoid_e5m2_grad")
LOSS_KERNELS = ("torch", "triton")
LOSS_REDUCTIONS = ("mean", "sum")
LOSS_DTYPES = ("fp32", "bf16", "bf16_train")


@refuse_moved("model.head")
@dataclass
class HeadConfig:
    """The `model.head` group: logits, their softcap and the training loss."""

    softcap: float = 30.0
    """The cap c of the softcap (`softcap_form`); 0 disables it."""
    softcap_form: str = field(default="tanh", metadata={"choices": SOFTCAP_FORMS})
    """tanh: c·tanh(z/c) | sigmoid: c·σ((z + b)/τ), b = softcap_shift, τ = softcap_divisor:
    the 2025-01 record's 30·σ(z/7.5) (b = 0, τ = c/4), record_2026_07_17's 23·σ((z + 5)/7.5)."""
    softcap_shift: float = 0.0
    """b of the sigmoid form (record_2026_07_17: 5)."""
    softcap_divisor: float = 0.0
    """τ of the sigmoid form; 0 = c/4 (record_2026_07_17: 7.5)."""
    loss: str = field(default="auto", metadata={"choices": LOSSES})
    """Softcapped cross-entropy: fused (chunked, for CPU caches) | plain (the formula, which
    torch.compile fuses on GPU) | auto: fused on CPU, plain elsewhere | sigmoid_e5m2_grad: the
    FP8 head, the sigmoid cap and the cross-entropy in one, the loss writing the head's e5m2
    logit gradient itself (model/record_loss.py, record_2026_07_17's form: σ rounded to bf16, the
    gradient with its end-of-sequence quirk; needs head.fp8, reduction=sum and the sigmoid
    cap; evaluation takes the plain formula)."""
    loss_kernel: str = field(default="torch", metadata={"choices": LOSS_KERNELS})
    """loss=sigmoid_e5m2_grad's kernel in training: torch (fp32 ops over 4,096-row chunks,
    model/record_loss.py) | triton (one kernel, one program a row, reading the bf16 logits and
    writing G₈: model/triton_loss.py; CUDA, or a CPU under TRITON_INTERPRET=1; G₈ equal to
    torch's but where an exp's last bit crosses an e5m2 boundary)."""
    reduction: str = field(default="mean", metadata={"choices": LOSS_REDUCTIONS})
    """The training loss over tokens: mean | sum (the 2025-11 record). Evaluation: the mean."""
    loss_dtype: str = field(default="fp32", metadata={"choices": LOSS_DTYPES})
    """fp32: cap and cross-entropy in fp32 at least | bf16: the cap in the logits' dtype, and in
    training the cross-entropy too (evaluation: fp32 cross-entropy) | bf16_train: in training the
    cap in the logits' dtype and the cross-entropy in fp32 from those capped values, in evaluation
    the logits cast to fp32 before the cap (record_medium_2025_12_31, M.2); needs
    head.loss≠fused."""
    fp8: bool = False
    """The LM head in FP8 while training (e4m3 forward, e5m2 gradients; divisors
    model.numerics.fp8_scales)."""
    init_std: float = 0.0
    """The head's initial weights N(0, init_std²); 0 = zero, so the first loss is ln(vocab)
    (record_2026_07_17: 0.005)."""
    bf16: bool = False
    """The LM head weight a bf16 parameter (the 2025-11 record); needs model.numerics.dtype=bf16."""
    mtp: bool = False
    """Multi-token prediction in training (record_2026_07_17, model/mtp.py): position i's logits are
    also scored against the targets of i+1 … i+K−1 of its row, weighted by the step's
    weights, a column of the stage table (train.stages.rows.N.mtp_weights; `mtp_weights_at`);
    evaluation stays next-token. Needs head.loss≠fused."""

    @property
    def tanh_expressible(self) -> bool:
        """Whether the cap is c'·tanh(z/c') plus a constant, which the fused loss computes:
        the tanh form, or the sigmoid form with b = 0 and τ = c/4 (c·σ(4z/c) = c/2·tanh(2z/c)
        + c/2)."""
        plain_sigmoid = not self.softcap_shift and self.softcap_divisor in (0, self.softcap / 4)
        return self.softcap_form == "tanh" or plain_sigmoid

    def validate(self) -> None:
        if self.loss_kernel != "torch" and self.loss != "sigmoid_e5m2_grad":
            raise ValueError(
                f"model.head.loss_kernel={self.loss_kernel} is the kernel of "
                f"model.head.loss=sigmoid_e5m2_grad; this run's loss is {self.loss}"
            )
        check_renamed(self, "head")
        if self.init_std < 0:
            raise ValueError(f"model.head.init_std must be >= 0, got {self.init_std}")
        if self.softcap < 0:
            raise ValueError(f"model.head.softcap must be >= 0, got {self.softcap}")
        if self.softcap_divisor < 0:
            raise ValueError(
                f"model.head.softcap_divisor must be >= 0 (0 = softcap/4), got "
                f"{self.softcap_divisor}"
            )
        if self.softcap_form == "tanh" and (self.softcap_shift or self.softcap_divisor):
            raise ValueError(
                "model.head.softcap_shift and model.head.softcap_divisor shape the sigmoid "
                "form: set model.head.softcap_form=sigmoid, or leave them 0"
            )
        if self.loss == "fused" and not self.tanh_expressible:
            raise ValueError(
                "model.head.loss=fused computes c·tanh(z/c), which the shifted sigmoid "
                "(model.head.softcap_shift / softcap_divisor) is not: use model.head.loss=plain "
                "or auto"
            )
        self._validate_loss_forms()
        if self.loss == "fused" and self.loss_dtype != "fp32":
            raise ValueError(
                "model.head.loss=fused computes in fp32: use model.head.loss=plain or auto "
                f"with model.head.loss_dtype={self.loss_dtype}"
            )

    def _validate_loss_forms(self) -> None:
        """MTP and the record's loss form (the FP8 head they need: ModelConfig)."""
        if self.mtp and self.loss == "fused":
            raise ValueError(
                "model.head.mtp needs model.head.loss=plain, auto or sigmoid_e5m2_grad: the fused "
                "loss scores the next token only"
            )
        if self.mtp and self.loss_dtype == "bf16" and self.loss != "sigmoid_e5m2_grad":
            raise ValueError(
                "model.head.mtp computes its cross-entropy in fp32: set model.head.loss_dtype="
                "fp32 or bf16_train, or model.head.loss=sigmoid_e5m2_grad"
            )
        if self.loss == "sigmoid_e5m2_grad":
            if self.softcap_form != "sigmoid" or self.softcap <= 0:
                raise ValueError(
                    "model.head.loss=sigmoid_e5m2_grad caps with c·σ((z + b)/τ): set "
                    "model.head.softcap_form=sigmoid and model.head.softcap > 0"
                )
            if self.reduction != "sum":
                raise ValueError(
                    "model.head.loss=sigmoid_e5m2_grad writes the gradient of the summed loss: set "
                    "model.head.reduction=sum"
                )
