"""Generate text from a trained checkpoint, as nanoGPT's sample.py does.

    python -m scripts.sample outputs/2025-01-01/12-00-00                 # a run's newest save
    python -m scripts.sample runs/x/checkpoints/step_000200 --prompt "The capital of France"
    python -m scripts.sample runs/x --num-samples 3 --temperature 1.0 --top-k 50 --seed 1
    python -m scripts.sample runs/x --top-k 1                            # greedy decoding

RUN_OR_CHECKPOINT is a run directory or its checkpoints/ directory (both: the newest complete
save, as `train.resume=<path>` picks it) or one step_NNNNNN directory. Both layouts load: a
torch_save checkpoint (a ddp_* dist.parallelism) and a dcp one (fsdp_*), whose shards are read back
into whole tensors on this one process. The model is rebuilt from the config saved with the
checkpoint, so no Hydra overrides are needed (model.compile is ignored).

The prompt is encoded as the start of a document, after <|endoftext|> as in the training
shards; the default empty prompt starts a fresh document. Each new token is drawn with
`torch.multinomial` (a generator seeded with --seed) from softmax(logits / temperature), kept
to the --top-k most likely tokens (0: all) of GPT-2's 50257 real tokens: the head's padding
rows up to model.vocab_size were never trained targets. The context is cropped to the last
train.seq_len tokens, the length the model was trained on. The model's step-dependent
arguments (a sliding window) are those of the final evaluation, from the run's schedule
(trainer/schedule.py). Samples print to stdout, each followed by a `---` line.

Each forward computes the logits of its last position only, and reads only the new token: the
keys and values of the others are kept in a KV cache (model/kv_cache.py) until the context is
full, after which each token reruns the cropped context, as --no-kv-cache does throughout. A
model whose parts read a neighbour's token or key, or a window (record presets: their windows,
paired heads, key offset, smear, bigram hash), reruns the context for every token, and says so.
The time per sample and its tokens/s go to stderr (`python scripts/bench/sampling.py`: the
cache against the whole-context rerun, same run).

bf16 autocast on CUDA, fp32 on CPU. Not supported: batched or multi-GPU generation, stopping
early at <|endoftext|> (it prints as text), torch.compile.
"""

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch import Tensor

from data.tokenizer import GPT2_VOCAB_SIZE, encode_document, gpt2_encoding
from model import GPT, ModelConfig
from model.kv_cache import KVCache, blockers
from optim.config import OptimConfig
from stages import StageTable
from trainer.checkpoint import files
from trainer.checkpoint.dcp_state import read_whole
from trainer.checkpoint.resume_rules import upgrade_saved
from trainer.checkpoint.upgrade import upgrade_config, upgrade_parts
from trainer.config import TrainConfig
from trainer.schedule import Schedule

SEPARATOR = "---"


def _saves_nothing(run_dir: Path) -> str:
    """A note when the run directory's own config saves no checkpoints (a smoke run)."""
    saved = run_dir / ".hydra" / "config.yaml"
    if not saved.is_file():
        return ""
    from omegaconf import OmegaConf

    train = OmegaConf.load(saved).get("train", {})
    if train.get("checkpoint_every", 1) or train.get("checkpoint_at_end", True):
        return ""
    return (
        ". That run saves no checkpoints (train.checkpoint_every=0 and "
        "train.checkpoint_at_end=false, as experiment=smoke sets): run without experiment=smoke, "
        "or add train.checkpoint_at_end=true"
    )


def find_checkpoint(setting: str) -> Path:
    """The checkpoint directory `setting` names (a run, checkpoints/ or step directory)."""
    try:
        path = files.resolve(setting, Path(setting))
    except files.CheckpointError as e:
        # resolve() words its errors for train.resume; here the path alone is the subject.
        why = str(e).removeprefix(f"train.resume={setting!r}: ")
        raise files.CheckpointError(why + _saves_nothing(Path(setting))) from e
    if path is None:  # resolve() reads "never" and "auto" as settings, not as paths
        raise files.CheckpointError(f"{setting} is not a checkpoint path")
    return path


def model_config(saved: dict[str, Any], path: Path) -> ModelConfig:
    """The checkpoint's ModelConfig (a saved config under today's keys, `upgrade_saved`); a key
    an older save lacks takes the field's default."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), {**saved, "compile": False})
    except OmegaConfBaseException as e:
        reason = str(e).splitlines()[0]
        msg = f"{path} was saved with model options unknown here: {reason}"
        raise files.CheckpointError(msg) from None
    return OmegaConf.to_object(merged)


def stage_table(saved: dict[str, Any]) -> StageTable:
    """The checkpoint's stage table (its saved train.stages; none: no stages): the model's
    YaRN tables follow its windows, and the schedule reads each step's row from it."""
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(StageTable), saved))


def read_state(path: Path, layout: str) -> dict[str, Tensor]:
    """The model's state_dict from a checkpoint directory (whole CPU tensors)."""
    # torch_save: model.pt only, as the optimizer state is larger than the model and unused
    source = path / (files.DCP_DIR if layout == "dcp" else "model.pt")
    try:
        if layout == "dcp":
            with warnings.catch_warnings():  # DCP warns that it reads without a process group
                warnings.simplefilter("ignore", UserWarning)
                return read_whole(source)[0]
        return torch.load(source, map_location="cpu", weights_only=True)
    except Exception as e:  # torch and DCP raise RuntimeError, pickle errors, EOFError, ...
        raise files.CheckpointError(f"{source} is corrupt or unreadable: {e}") from e


def load_model(path: Path, device: torch.device) -> tuple[GPT, dict[str, Any]]:
    """The checkpoint's model in eval mode on `device`, and the checkpoint's metadata (its
    config in today's key names)."""
    meta = files.validate(path)
    meta["config"] = upgrade_saved(upgrade_config(meta.get("config", {}), meta))
    cfg = model_config(meta["config"].get("model", {}), path)
    model = GPT(cfg, stage_table(meta["config"].get("train", {}).get("stages", {})))
    try:
        state = read_state(path, meta.get("layout", "torch_save"))
        model.load_state_dict(upgrade_parts({"model": state}, meta)["model"])  # today's names
    except RuntimeError as e:
        last = str(e).splitlines()[-1].strip()
        raise files.CheckpointError(
            f"{path} does not match the model its saved config describes: {last}"
        ) from e
    return model.to(device).eval(), meta


def forward_args(model: GPT, config: dict[str, Any], device: torch.device) -> dict[str, Tensor]:
    """The model's step-dependent forward arguments at the end of training: the final
    evaluation's, from the run's schedule over its saved steps and stage table (the
    optimizer's part of it is not used here)."""
    saved = config.get("train", {})
    steps = saved.get("steps", TrainConfig.steps)
    train = TrainConfig(steps=steps, extension_steps=saved.get("extension_steps", 0),
                        stages=stage_table(saved.get("stages", {})))  # fmt: skip
    schedule = Schedule(steps, OptimConfig(), model.cfg, train)
    return {k: torch.tensor(v, device=device) for k, v in schedule.model_args(steps).items()}


@torch.no_grad()
def generate(
    model: GPT,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    generator: torch.Generator,
    context: int,
    model_args: dict[str, Tensor],
    cached: bool = False,
) -> Tensor:
    """`idx` (B, T) extended by `max_new_tokens` sampled tokens. `cached` (where the model
    allows it: model/kv_cache.py `blockers`): each forward reads only the new token, beside a
    KV cache of the others, until the context is full; from then on, as without it, each token
    reruns the last `context` tokens."""
    cuda = idx.device.type == "cuda"
    cache, pending = None, idx  # the tokens the next forward reads
    for _ in range(max_new_tokens):
        if cached and (cache is None or cache.length + pending.size(1) > context):
            cache = KVCache(context, model.cfg.attention.document_mask)
            pending = idx[:, -context:]
        with torch.autocast(idx.device.type, dtype=torch.bfloat16, enabled=cuda):
            if cache is None:
                logits = model(idx[:, -context:], last=True, **model_args)
            else:
                logits = model(pending, cache=cache, last=True, **model_args)
        logits = logits[:, -1, :GPT2_VOCAB_SIZE].float() / temperature
        if top_k:
            kth = torch.topk(logits, min(top_k, GPT2_VOCAB_SIZE)).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        pending = torch.multinomial(probs, 1, generator=generator)
        idx = torch.cat([idx, pending], dim=1)
    return idx


def pick_device(setting: str) -> torch.device:
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but no CUDA device is visible; use cpu or auto")
    return torch.device(setting)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m scripts.sample", description=__doc__.splitlines()[0]
    )
    p.add_argument(
        "checkpoint",
        metavar="RUN_OR_CHECKPOINT",
        help="a run directory, its checkpoints/ directory or a step_NNNNNN directory",
    )
    p.add_argument("--prompt", default="", help="text to continue (default: a fresh document)")
    p.add_argument("--max-new-tokens", type=int, default=100, help="tokens to generate (100)")
    p.add_argument(
        "--temperature", type=float, default=0.8, help="< 1 sharper, > 1 more random (0.8)"
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=200,
        help="sample among the k likeliest tokens; 0 = all, 1 = greedy (200)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (0)")
    p.add_argument("--num-samples", type=int, default=1, help="samples to print (1)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="auto: cuda when available, else cpu")  # fmt: skip
    p.add_argument("--no-kv-cache", action="store_true",
                   help="rerun the whole context for every token")  # fmt: skip
    args = p.parse_args(argv)
    if args.max_new_tokens < 0 or args.top_k < 0 or args.num_samples < 1:
        p.error("--max-new-tokens and --top-k must be >= 0, --num-samples >= 1")
    if not args.temperature > 0:
        p.error(f"--temperature must be > 0 (for greedy output use --top-k 1), got "
                f"{args.temperature}")  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        device = pick_device(args.device)
        path = find_checkpoint(args.checkpoint)
        model, meta = load_model(path, device)
    except ValueError as e:  # CheckpointError, and a saved config that GPT rejects
        sys.exit(f"error: {e}")
    config = meta.get("config", {})
    context = config.get("train", {}).get("seq_len", TrainConfig.seq_len)
    print(f"sampling from {path} (step {meta.get('step')}, context {context} tokens, {device})",
          file=sys.stderr)  # fmt: skip
    prompt = torch.tensor([encode_document(args.prompt)], device=device)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    model_args = forward_args(model, config, device)
    cached = not args.no_kv_cache and not (off := blockers(model.cfg))
    if not args.no_kv_cache and off:
        print(f"no KV cache for this model ({', '.join(off)}): each token reruns the context",
              file=sys.stderr)  # fmt: skip
    enc = gpt2_encoding()
    for _ in range(args.num_samples):
        t0 = time.perf_counter()
        out = generate(model, prompt, args.max_new_tokens, args.temperature, args.top_k,
                       generator, context, model_args, cached)  # fmt: skip
        took = time.perf_counter() - t0
        print(enc.decode(out[0, 1:].tolist()))  # the prompt and its continuation, sans EOT
        print(SEPARATOR, flush=True)
        rate = args.max_new_tokens / max(took, 1e-9)
        print(f"{args.max_new_tokens} tokens in {took:.2f} s ({rate:.1f} tokens/s)",
              file=sys.stderr)  # fmt: skip


if __name__ == "__main__":
    main()
