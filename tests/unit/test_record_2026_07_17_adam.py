"""record_2026_07_17's Adam (docs/records.md D.3, D.10 item 7): role routing of its gates
onto Adam (`optim.roles`), the per-tensor table (`optim.adamw.table`), cautious weight decay
with a strict mask and λ from the tensor's own LR, fp32 moments, updates on odd steps from
two summed gradients. The formula is written out in float64 below from D.3 alone, with
negative controls (a wrong β, ≥ for >, λ from the group's LR) that it must tell apart."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from model import GPT, ModelConfig
from model.config import update
from model.config.param_optim import ParamOptim
from optim import build_optimizer
from optim.adam import Adam
from optim.adam_table import resolve_table
from optim.config import AdamRow, AdamWConfig, OptimConfig
from optim.groups import partition_params
from optim.schedule import OptimValues
from tests.helpers import dotted, stage_table
from tests.unit.test_record_2026_07_17_model import PRESET

CPU = torch.device("cpu")
BASE, LAMBDA, EPS = 0.008, 0.005, 1e-10
# record_2026_07_17's Adam as its preset would write it (the report's snippet).
RECORD_2026_07_17 = """
roles:
  "blocks.*.attn.gate.weight": scalar
  smear_gate.weight: scalar
  skips.token_gate.weight: scalar
adamw:
  embed_lr: 0.008
  head_lr: 0.008
  scalar_lr: 0.008
  eps_placement: raw
  state_dtype: fp32
  update_every: 2
  weight_decay: 0.005
  weight_decay_form: cautious
  table:
    scalars.packed: {lr_mul: 5, beta1: 0.9, beta2: 0.99, wd_mul: 0}
    smear_gate.weight: {lr_mul: 0.01, beta1: 0.9, beta2: 0.99, wd_mul: 0}
    skips.token_gate.weight: {lr_mul: 0.05, beta1: 0.9, beta2: 0.99, wd_mul: 0}
    "blocks.*.attn.gate.weight": {lr_mul: 1, beta1: 0.9, beta2: 0.99, wd_mul: 1}
    value_gates.weight: {lr_mul: 1, beta1: 0.9, beta2: 0.99, wd_mul: 1}
    lm_head.weight: {lr_mul: 1, beta1: 0.5, beta2: 0.95, wd_mul: 150}
    embed.weight: {lr_mul: 1, beta1: 0.5, beta2: 0.95, wd_mul: 150}
    "value_embeds.*": {lr_mul: 75, beta1: 0.75, beta2: 0.95, wd_mul: 5}
    sublayer_scales.post_lambdas: {lr_mul: 1, beta1: 0.9, beta2: 0.95, wd_mul: 0}
    x0_injection.lambdas: {lr_mul: 1, beta1: 0.9, beta2: 0.95, wd_mul: 0}
    xsa.alphas: {lr_mul: 1, beta1: 0.9, beta2: 0.95, wd_mul: 0}
    sublayer_scales.resid_lambdas: {lr_mul: 5, beta1: 0.9, beta2: 0.95, wd_mul: 0}
    "mudd.w[12]": {lr_mul: 0.25, beta1: 0.9, beta2: 0.99, wd_mul: 1}
    mudd.b2: {lr_mul: 0.25, beta1: 0.9, beta2: 0.99, wd_mul: 0}
"""
# D.3's rows of the bigram part: its section declares them on its parameters (model.bigram.optim)
BIGRAM = {"embed": {"lr_mul": 75, "beta1": 0.75, "beta2": 0.95, "wd_mul": 5},
          "lambdas": {"lr_mul": 1, "beta1": 0.9, "beta2": 0.95, "wd_mul": 0}}  # fmt: skip


def optim_config(text: str = RECORD_2026_07_17, **adamw: object) -> OptimConfig:
    cfg = OmegaConf.merge(OmegaConf.structured(OptimConfig), OmegaConf.create(text))
    cfg = OmegaConf.to_object(cfg)
    for key, value in adamw.items():
        setattr(cfg.adamw, key, value)
    cfg.validate(10)
    return cfg


class Toy(nn.Module):
    """One tensor per kind of row: a table, the head, the scalars, a 2-D gate (a matrix by
    shape, routed to Adam)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(5, 4, dtype=torch.float64)
        self.lm_head = nn.Linear(4, 5, bias=False, dtype=torch.float64)
        self.scalars = nn.Parameter(torch.zeros(6, dtype=torch.float64))
        self.gate = nn.Linear(3, 2, bias=False, dtype=torch.float64)


TOY_ROWS = {"embed.weight": (75, (0.75, 0.95), 5), "lm_head.weight": (1, (0.5, 0.95), 150),
            "scalars": (5, (0.9, 0.99), 0), "gate.weight": (1, (0.9, 0.99), 1)}  # fmt: skip
TOY = "roles: {gate.weight: scalar}\nadamw:\n  table:\n" + "".join(
    f"    {n}: {{lr_mul: {m}, beta1: {b[0]}, beta2: {b[1]}, wd_mul: {w}}}\n"
    for n, (m, b, w) in TOY_ROWS.items()
)
FS = [1.0, 0.9, 0.8, 0.7]  # f(s) at s = 0..3


def reference(p0, grads, row, *, beta2=None, strict=True, group_lr_decay=False):
    """D.3's Adam in float64: the gradient held at even s, summed with the odd step's; at odd
    s with t = the update count, lr = 0.008·lr_mul·f(s),
    u = lr·√(1−β₂ᵗ)/(1−β₁ᵗ)·m/(√v + ε), M = 1[u⊙p > 0], p ← p − u − 0.005·wd_mul·lr²·M⊙p."""
    lr_mul, (b1, b2), wd_mul = row
    b2 = b2 if beta2 is None else beta2
    p, m, v, acc, t, out = p0.clone(), 0.0, 0.0, 0.0, 0, []
    for s, (g, f) in enumerate(zip(grads, FS, strict=False)):
        acc = acc + g
        if s % 2:
            t += 1
            m, v = b1 * m + (1 - b1) * acc, b2 * v + (1 - b2) * acc * acc
            lr = BASE * lr_mul * f
            u = lr * math.sqrt(1 - b2**t) / (1 - b1**t) * m / (v.sqrt() + EPS)
            mask = ((u * p > 0) if strict else (u * p >= 0)).double()
            decay_lr = BASE * f if group_lr_decay else lr
            p, acc = p - u - LAMBDA * wd_mul * decay_lr**2 * mask * p, 0.0
        out.append(p.clone())
    return out


def toy_run(model: nn.Module, cfg: OptimConfig) -> tuple[dict, dict, dict]:
    """Four steps at f(s) = FS with random gradients, some entries zero in both steps of the
    first pair (u = 0 there: only ≥ would decay them). Returns the initial parameters, the
    gradients and the parameters after each step, by name."""
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)
    opt = build_optimizer(model, cfg, device=CPU)
    p0 = {n: p.detach().clone() for n, p in model.named_parameters()}
    zero = {n: torch.rand(p.shape, generator=gen) < 0.3 for n, p in model.named_parameters()}
    grads = {n: [] for n in p0}
    after = {n: [] for n in p0}
    for s, f in enumerate(FS):
        opt.set_step(OptimValues(lr_mult=f, muon_momentum=0.95))
        for n, p in model.named_parameters():
            g = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            p.grad = g.masked_fill(zero[n], 0.0) if s < 2 else g
            grads[n].append(p.grad.clone())
        opt.step()
        opt.zero_grad()
        for n, p in model.named_parameters():
            after[n].append(p.detach().clone())
    return p0, grads, after


def close(a: list, b: list) -> bool:
    return all(torch.allclose(x, y, rtol=1e-12, atol=1e-15) for x, y in zip(a, b, strict=True))


def test_steps_0_to_3_are_the_formula_and_the_misreadings_are_not() -> None:
    cfg = optim_config(TOY, embed_lr=BASE, head_lr=BASE, scalar_lr=BASE, eps_placement="raw",
                       update_every=2, weight_decay=LAMBDA,
                       weight_decay_form="cautious")  # fmt: skip
    p0, grads, got = toy_run(Toy(), cfg)
    for name, row in TOY_ROWS.items():
        assert torch.equal(got[name][0], p0[name]), name  # s = 0: held, nothing moves
        assert torch.equal(got[name][2], got[name][1]), name  # s = 2: held
        assert close(got[name], reference(p0[name], grads[name], row)), name
    head, table = TOY_ROWS["lm_head.weight"], TOY_ROWS["embed.weight"]
    assert not close(
        got["lm_head.weight"],
        reference(p0["lm_head.weight"], grads["lm_head.weight"], head, beta2=0.99),
    )
    assert not close(
        got["lm_head.weight"],
        reference(p0["lm_head.weight"], grads["lm_head.weight"], head, strict=False),
    )
    assert not close(got["embed.weight"], reference(p0["embed.weight"], grads["embed.weight"],
                                                    table, group_lr_decay=True))  # fmt: skip


def test_fp32_moments_and_one_rounding_to_bf16() -> None:
    """bf16 parameters with fp32 moments: the step in fp32, rounded to nearest once on store
    (not truncated, not in bf16 arithmetic as with state_dtype=param); the two gradients are
    summed in bf16, as autograd accumulates them."""
    gen = torch.Generator().manual_seed(3)
    w0 = torch.randn(96, generator=gen).bfloat16()
    gs = [torch.randn(96, generator=gen).bfloat16() for _ in range(2)]
    row = (75, (0.75, 0.95), 5)
    want = reference(w0.double(), [gs[0].double(), (gs[0] + gs[1]).double() - gs[0].double()],
                     row)[1]  # fmt: skip
    got = {}
    for dtype in ("fp32", "param"):
        p = w0.clone().requires_grad_()
        settings = AdamWConfig(eps_placement="raw", state_dtype=dtype, update_every=2,
                               weight_decay=LAMBDA, weight_decay_form="cautious",
                               table={"w": AdamRow(75, 0.75, 0.95, 5)})  # fmt: skip
        rows = resolve_table([("w", p)], [], OptimConfig(adamw=settings))
        opt = Adam([{"params": [("w", p)], "lr": BASE * FS[1]}], settings, rows)
        for g in gs:
            p.grad = g
            opt.step()
        moments = {opt.state[p][k].dtype for k in ("exp_avg", "exp_avg_sq")}
        assert moments == {torch.float32 if dtype == "fp32" else torch.bfloat16}
        got[dtype] = p.detach()
    assert torch.equal(got["fp32"], want.bfloat16())
    truncated = (want.float().view(torch.int32) & -65536).view(torch.float32).bfloat16()
    assert not torch.equal(got["fp32"], truncated)
    assert not torch.equal(got["param"], got["fp32"])


def test_fp32_moments_of_a_bf16_parameter_resume_exactly() -> None:
    """torch's load_state_dict would cast them to bf16; they come back bit for bit."""
    settings = AdamWConfig(eps_placement="raw", state_dtype="fp32", update_every=2,
                           weight_decay=LAMBDA, weight_decay_form="cautious")  # fmt: skip
    gen = torch.Generator().manual_seed(4)
    gs = [torch.randn(8, 4, generator=gen).bfloat16() for _ in range(5)]
    p0 = torch.randn(8, 4, generator=gen).bfloat16()
    runs = []
    for cut in (None, 3):
        p = p0.clone().requires_grad_()
        opt = Adam([{"params": [p], "lr": 0.1}], settings)
        for s, g in enumerate(gs):
            if s == cut:
                saved = opt.state_dict()
                opt = Adam([{"params": [p], "lr": 0.1}], settings)
                opt.load_state_dict(saved)
                assert opt.state[p]["exp_avg"].dtype == torch.float32
            p.grad = g
            opt.step()
        runs.append(p.detach())
    assert torch.equal(*runs)


@pytest.fixture(scope="module")
def record_2026_07_17() -> nn.Module:
    """record_2026_07_17's model at toy width, on the meta device (names and shapes only)."""
    toy = {"n_embd": 96, "compile": False, "bigram.rows": 97, "bigram.dim": 8,
           "bigram.signs": 16, "residual.mudd_hidden": 8}  # fmt: skip
    toy |= {f"bigram.optim.{p}": ParamOptim(**row) for p, row in BIGRAM.items()}
    cfg = update(ModelConfig(), dotted(OmegaConf.to_container(OmegaConf.load(PRESET))) | toy)
    stages = stage_table([3, 7, 11], window_after=13, window_final_eval=20)  # the experiment's
    with torch.device("meta"):
        return GPT(cfg, stages)


MUON = {"attn.qkvo", "mlp.fc.weight", "mlp.proj.weight"}
GATES = {f"blocks.{i}.attn.gate.weight" for i in (0, 1, 2, 3, 4, 5, 7, 8, 9, 10)}


def test_routing_puts_record_2026_07_17_gates_on_adam(record_2026_07_17: nn.Module) -> None:
    """By shape today the 2-D gates are Muon's; routed, Muon keeps Q/K/V/O and the MLP only."""
    plain = {n for n, _ in partition_params(record_2026_07_17, "muon_adamw")["muon"]}
    assert GATES | {"smear_gate.weight", "skips.token_gate.weight"} <= plain
    groups = partition_params(record_2026_07_17, "muon_adamw", optim_config().roles)
    assert all(n.split(".", 2)[-1] in MUON for n, _ in groups["muon"])
    assert GATES | {"smear_gate.weight", "skips.token_gate.weight"} <= {
        n for n, _ in groups["scalar"]
    }


# D.3's Adam table: row -> (LR, betas, λ_eff / lr² / 0.005 = wd_mul), with our names.
D3 = {
    "scalars.packed": (0.04, (0.9, 0.99), 0), "smear_gate.weight": (8e-5, (0.9, 0.99), 0),
    "skips.token_gate.weight": (4e-4, (0.9, 0.99), 0),
    **{g: (0.008, (0.9, 0.99), 1) for g in GATES}, "value_gates.weight": (0.008, (0.9, 0.99), 1),
    "lm_head.weight": (0.008, (0.5, 0.95), 150), "embed.weight": (0.008, (0.5, 0.95), 150),
    **{f"value_embeds.{i}.weight": (0.6, (0.75, 0.95), 5) for i in range(5)},
    "bigram.embed.weight": (0.6, (0.75, 0.95), 5),
    **{n: (0.008, (0.9, 0.95), 0) for n in ("sublayer_scales.post_lambdas", "x0_injection.lambdas",
                                            "bigram.lambdas", "xsa.alphas")},
    "sublayer_scales.resid_lambdas": (0.04, (0.9, 0.95), 0), "mudd.w1": (0.002, (0.9, 0.99), 1),
    "mudd.w2": (0.002, (0.9, 0.99), 1), "mudd.b2": (0.002, (0.9, 0.99), 0),
}  # fmt: skip


def test_every_adam_tensor_of_record_2026_07_17_takes_its_d3_row(
    record_2026_07_17: nn.Module,
) -> None:
    cfg = optim_config()
    groups = partition_params(record_2026_07_17, "muon_adamw", cfg.roles)
    adam = [x for k in ("embed", "head", "scalar") for x in groups[k]]
    assert {n for n, _ in adam} == set(D3)
    rows = resolve_table(adam, groups["muon"], cfg)
    assert rows.keys() == D3.keys()
    for name, (lr, betas, wd_mul) in D3.items():
        row = rows[name]
        assert (BASE * row.lr_mul, row.betas, row.wd_mul) == (pytest.approx(lr), betas, wd_mul)
    opt = build_optimizer(record_2026_07_17, cfg, device=CPU)
    assert "Adam table" in opt.groups_table and "cautious" in opt.summary


def test_errors_name_the_key() -> None:
    model = Toy()
    cases = [
        ({"table": {"nothing*": AdamRow()}}, {}, r"optim\.adamw\.table: \['nothing\*'\] match"),
        ({"table": {"emb*": AdamRow(), "embed.*": AdamRow()}}, {},
         r"optim\.adamw\.table: 'embed\.weight' matches"),
        ({"table": {"gate.*": AdamRow()}}, {}, r"optim\.adamw\.table\['gate\.\*'\] matches "
         r"'gate\.weight', which Adam does not step"),
        ({"table": {"scalars": AdamRow()}}, {"lr_mul": {"scal*": 2.0}},
         r"optim\.adamw\.table\['scalars'\] and optim\.lr_mul\['scal\*'\]"),
        ({}, {"roles": {"nothing": "scalar"}}, r"optim\.roles: \['nothing'\] match no"),
        ({}, {"roles": {"gate.*": "scalar", "*.weight": "embed"}}, r"optim\.roles: 'gate"),
    ]  # fmt: skip
    for adamw, optim, error in cases:
        cfg = OptimConfig(adamw=AdamWConfig(update_every=2, **adamw), **optim)
        with pytest.raises(ValueError, match=error):
            build_optimizer(model, cfg, device=CPU)
    bad = [
        ({"table": {"x": AdamRow(beta2=1.0)}}, r"optim\.adamw\.table\['x'\]\.beta2"),
        ({"table": {"x": AdamRow(lr_mul=0)}}, r"optim\.adamw\.table\['x'\]: lr_mul"),
        ({"weight_decay_form": "strict"}, r"optim\.adamw\.weight_decay_form"),
        ({"state_dtype": "fp16"}, r"optim\.adamw\.state_dtype"),
    ]
    for adamw, error in bad:
        with pytest.raises(ValueError, match=error):
            AdamWConfig(**adamw).validate()
    with pytest.raises(ValueError, match=r"optim\.roles\['x'\] must be one of"):
        OptimConfig(roles={"x": "muon"}).validate(10)
    with pytest.raises(Exception, match="bta1"):
        optim_config("adamw: {table: {x: {bta1: 0.5}}}")


def test_off_changes_nothing() -> None:
    """The defaults build torch's AdamW and route by shape; an identity table row leaves
    optim/adam.py's decoupled step bit for bit as without the table."""
    cfg = OptimConfig()
    assert cfg.adamw.torch_equivalent and not cfg.roles and not cfg.adamw.table
    for key, value in (("weight_decay_form", "cautious"), ("state_dtype", "fp32"),
                       ("table", {"x": AdamRow()})):  # fmt: skip
        assert not AdamWConfig(**{key: value}).torch_equivalent, key
    assert type(build_optimizer(Toy(), cfg, device=CPU).parts[-1]) is torch.optim.AdamW
    settings = AdamWConfig(eps_placement="raw", update_every=2, weight_decay=0.1)
    out = []
    for table in ({}, {"w": AdamRow(beta1=0.9, beta2=0.95)}):
        p = torch.linspace(-1, 1, 12).requires_grad_()
        rows = resolve_table([("w", p)], [], OptimConfig(adamw=AdamWConfig(table=table)))
        opt = Adam([{"params": [("w", p)], "lr": 0.01}], settings, rows)
        for s in range(4):
            p.grad = torch.cos(torch.arange(12.0) * (s + 1))
            opt.step()
        out.append(p.detach())
    assert torch.equal(*out)


def test_the_preset_holds_record_2026_07_17_adam() -> None:
    """experiment=record_2026_07_17 sets every key of RECORD_2026_07_17 above (D.3's Adam)."""
    from tests.helpers import compose_config  # here: Hydra's composition for this test only

    got = OmegaConf.to_container(compose_config(["experiment=record_2026_07_17"]).optim)
    want = OmegaConf.to_container(OmegaConf.create(RECORD_2026_07_17))
    for key in ("roles", "adamw"):
        for name, value in want[key].items():
            assert got[key][name] == value, (key, name)
    bigram = compose_config(["experiment=record_2026_07_17"]).model.bigram.optim
    assert OmegaConf.to_container(bigram) == BIGRAM


def test_a_parts_own_settings_are_its_row_and_only_there(record_2026_07_17: nn.Module) -> None:
    """The bigram part's parameters carry their D.3 rows (model.bigram.optim); a table
    pattern or an optim.lr_mul pattern that also names them is an error, as is a Muon
    parameter that declares Adam settings. Settings left at the group's own are no row."""
    cfg = optim_config()
    groups = partition_params(record_2026_07_17, "muon_adamw", cfg.roles)
    adam = [x for k in ("embed", "head", "scalar") for x in groups[k]]
    rows = resolve_table(adam, groups["muon"], cfg)
    assert rows["bigram.embed.weight"].pattern == "bigram.embed.weight (its own)"
    twice = optim_config(
        RECORD_2026_07_17.replace("  table:\n", "  table:\n    bigram.lambdas: {}\n")
    )
    with pytest.raises(ValueError, match=r"table\['bigram.lambdas'\] matches 'bigram.lambdas', "
                       r"whose part declares its own Adam settings"):  # fmt: skip
        resolve_table(adam, groups["muon"], twice)
    scaled = optim_config()
    scaled.lr_mul = {"bigram.*": 2.0}
    with pytest.raises(ValueError, match=r"optim.lr_mul\['bigram.\*'\] matches"):
        resolve_table(adam, groups["muon"], scaled)
    w = nn.Parameter(torch.zeros(4, 4))
    w.optim_settings = ParamOptim(lr_mul=2.0)  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="'w' declares its own Adam settings, but Muon steps it"):
        resolve_table(adam, [("w", w)], cfg)
    w.optim_settings = ParamOptim()  # type: ignore[attr-defined]  # the group's: no row, no error
    assert resolve_table([("w", w)], [], OptimConfig()) == {}
