"""Export a run's model in Hugging Face format: ``python gpt2/export.py --run-dir DIR``.

Writes a folder that ``transformers.GPT2LMHeadModel.from_pretrained`` and
``AutoTokenizer.from_pretrained`` load (default: ``<run>/hf``):

    config.json            GPT2Config: the run's dimensions, n_positions = its context
    model.safetensors      the newest checkpoint's weights, float32 (pruned zeros kept)
    generation_config.json
    vocab.json, merges.txt, tokenizer_config.json, special_tokens_map.json
                           the GPT-2 BPE (the offline files kgpt tokenizes with)
    kgpt.json              where it came from: run, step, config hash, checkpoint
                           sha256, and what the format does not hold

The folder is written complete beside ``--out`` and then put in its place: a folder
that exists is written only when it is empty or an earlier export of the same run
(replaced whole); a run folder, or any other folder with files in it, is refused.

The logits transformers computes equal kgpt's over the 50257 real tokens
(tests/test_export.py). What the format does not hold:

* kgpt pads the vocabulary to 50304 rows for speed; the 47 padded rows never occur
  in data and kgpt never samples them, so they are cut (``--keep-padded-vocab``
  keeps them: the logits are then equal over all 50304).
* A custom size is just GPT2Config's dimensions; a model without biases gets zero
  biases (Hugging Face's GPT-2 always has them), which compute the same.
* Training state (optimizer, pruning masks, data position) stays in the run: masks
  are not needed to compute, the pruned weights are zeros in the weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run by path (python gpt2/export.py): run as the module instead, so gpt2/ is not
    # first on the import path (see gpt2/train.py).
    import os

    os.execv(sys.executable, [sys.executable, "-m", "gpt2.export", *sys.argv[1:]])

import json
import os
import shutil

from gpt2.config.argparser import StrictArgumentParser
from gpt2.config.datasets import characters
from gpt2.data.tokenizer import EOT_TOKEN, VOCAB_SIZE, tokenizer_files
from gpt2.errors import CheckpointError, ConfigError, DataError, ExportError, StorageError
from gpt2.model import pretrained
from gpt2.model.build import model_config
from gpt2.storage import (RESULTS_SETTING, fsync_dir, make_folder, new_folder,
                          read_json_object, replace_folder, write_bytes_atomic,
                          write_text_atomic, writing)
from gpt2.training import checkpoint, provenance, trained
from gpt2.run_folder import read_summary
from gpt2 import run_folder

EOT = "<|endoftext|>"
LAYER_NORM_EPS = 1e-5  # torch's LayerNorm default, which gpt2/model/gpt.py uses


def hf_config(cfg, vocab: int) -> dict:
    """GPT2Config's fields for the model ``cfg`` (a kgpt Config) builds."""
    n_layer, n_head, n_embd = cfg.dims()
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": vocab, "n_positions": cfg.block_size, "n_embd": n_embd,
        "n_layer": n_layer, "n_head": n_head, "n_inner": None,
        "activation_function": "gelu_new",  # GELU, tanh approximation, as ours
        "resid_pdrop": cfg.dropout, "embd_pdrop": cfg.dropout, "attn_pdrop": cfg.dropout,
        "layer_norm_epsilon": LAYER_NORM_EPS, "initializer_range": 0.02,
        "scale_attn_weights": True, "use_cache": True,
        "bos_token_id": EOT_TOKEN, "eos_token_id": EOT_TOKEN,
        "tie_word_embeddings": cfg.tie_weights, "torch_dtype": "float32",
    }


def write_tokenizer(out: Path, context: int) -> None:
    files = tokenizer_files()
    write_bytes_atomic(out / "vocab.json", files["encoder.json"][0].read_bytes())
    write_bytes_atomic(out / "merges.txt", files["vocab.bpe"][0].read_bytes())
    special = {"bos_token": EOT, "eos_token": EOT, "unk_token": EOT}
    write_text_atomic(out / "special_tokens_map.json", json.dumps(special, indent=2) + "\n")
    write_text_atomic(out / "tokenizer_config.json", json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "model_max_length": context,
         "add_prefix_space": False, "errors": "replace", **special}, indent=2) + "\n")


# What an export folder holds: all of it is replaced by the next export of its run.
RECORD = "kgpt.json"
CARD = "README.md"  # the model card Hugging Face shows
FILES = ("config.json", "model.safetensors", "generation_config.json", "vocab.json",
         "merges.txt", "tokenizer_config.json", "special_tokens_map.json", CARD, RECORD)


def model_card(cfg, record: dict, summary, made: dict | None, params: int) -> str:
    """README.md of an export: what the model is, what it was trained on and how long,
    what it reached, and the code and data that made it, from the run's own files."""
    def figure(key: str, fmt: str) -> str:
        value = summary.get(key) if summary else None
        return "n/a" if not isinstance(value, (int, float)) else format(value, fmt)

    code = (made or {}).get("code") or {}
    data = (made or {}).get("data") or {}
    pruning = ("none (dense)" if cfg.pruning_method == "none" else
               f"{cfg.pruning_method}, target sparsity {cfg.target_sparsity:g}"
               + ("" if cfg.pruning_structure == "unstructured" else f" ({cfg.pruning_structure})")
               + f", measured {figure('final_sparsity', '.3f')}")
    return "\n".join([
        "---", "library_name: transformers", "pipeline_tag: text-generation",
        "tags: [gpt2, kgpt]", "---", "",
        f"# {cfg.run_name}", "",
        f"A GPT-2 language model trained from scratch with kgpt: {params:,} parameters, "
        f"{cfg.n_layer} layers, {cfg.n_head} heads, width {cfg.n_embd}, context "
        f"{cfg.block_size} tokens, GPT-2's BPE vocabulary.", "",
        "## Training", "",
        f"- data: `{cfg.dataset}` ({data.get('train_tokens', 'n/a')} training tokens, data "
        f"fingerprint `{data.get('sha256', 'n/a')}`)",
        f"- steps: {record['step']:,} of {record.get('max_iters') or 'n/a'} "
        f"({record['status']}); tokens seen: {figure('tokens', ',')}; epochs: "
        f"{figure('epochs_trained', '.2f')}",
        f"- optimizer: {cfg.optimizer}, learning rate {cfg.learning_rate:g} "
        f"({cfg.lr_schedule}, warmup {cfg.warmup_iters}), weight decay {cfg.weight_decay:g}, "
        f"{cfg.tokens_per_step():,} tokens per step, seed {cfg.seed}",
        f"- pruning: {pruning}", "",
        "## Results", "",
        f"- final validation loss {figure('final_val_loss', '.4f')} (perplexity "
        f"{figure('final_val_ppl', '.2f')}) on {figure('val_tokens', ',')} validation tokens "
        f"of the same dataset", "",
        "## Made by", "",
        f"- kgpt commit `{code.get('commit', 'n/a')}`"
        + (" (with uncommitted changes)" if code.get("dirty") else "")
        + f", PyTorch {code.get('torch', 'n/a')}; configuration hash `{record['config_hash']}`",
        f"- the run's checkpoint `{record['checkpoint']}` (sha256 "
        f"`{record.get('checkpoint_sha256') or 'n/a'}`); `kgpt.json` has the full record",
        "- not exported: " + "; ".join(record["not_exported"]), "",
        "## Use", "", "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained(\"<this folder>\")",
        "tokenizer = AutoTokenizer.from_pretrained(\"<this folder>\")", "```", ""])


def destination_problem(run_dir: Path, out: Path) -> str | None:
    """Why ``out`` may not receive ``run_dir``'s export; None when it may: a folder
    that does not exist yet, an empty one, or an earlier export of this run (which
    the new one replaces). Anything else is someone's files: a run folder (its
    config.json would be overwritten), or any folder with files kgpt did not write."""
    if out.is_symlink():
        # (followed, a link could send the files anywhere it points)
        return (f"--out {out} is a symbolic link: name a folder itself, a new one (default: "
                "<run>/hf)")
    if out.exists() and not out.is_dir():
        return f"--out {out} is a file, not a folder: name a new folder (default: <run>/hf)"
    if not out.exists():
        return None
    try:
        names = {p.name for p in out.iterdir()}
    except OSError as e:
        return f"--out {out} cannot be read ({e.strerror}): name a folder you can write"
    if not names:
        return None
    if out.resolve() == run_dir.resolve() or (
            run_folder.CONFIG_JSON in names and names & {run_folder.SUMMARY, run_folder.METRICS,
                                                         run_folder.CKPT,
                                                "provenance.json", "checkpoints"}):
        return (f"--out {out} is a run folder: the export's config.json would replace the "
                "run's own. Export into a folder of its own (default: <run>/hf)")
    record = read_json(out / RECORD)
    others = sorted((names - set(FILES)) | {n for n in names & set(FILES)
                                             if (out / n).is_symlink() or not (out / n).is_file()})
    if record.get("run") == str(run_dir.resolve()):
        if not others:
            return None
        return (f"--out {out} holds this run's earlier export and files kgpt did not write "
                f"there ({', '.join(others)[:200]}): the export replaces the folder whole, so "
                "move them away, or name a new or empty folder (default: <run>/hf)")
    whose = (f"an export of another run ({record['run']})" if isinstance(record.get("run"), str)
             else "not an export of this run")
    return (f"--out {out} holds files and is {whose}: kgpt replaces only its own export of "
            f"{run_dir}. Name a new or empty folder (default: <run>/hf)")


def read_json(path: Path) -> dict:
    return read_json_object(path) or {}


def export(run_dir: Path, out: Path, keep_padded_vocab: bool = False) -> dict:
    """Write the Hugging Face folder ``out`` from the run in ``run_dir``; returns
    what kgpt.json records. The folder is written complete beside ``out`` and then
    put in its place in one step (gpt2/storage.py replace_folder): an earlier export
    of the run is replaced whole, never mixed with the new one; a folder that is not
    one is refused (ExportError) before anything is written."""
    from safetensors.torch import save

    problem = destination_problem(run_dir, out)
    if problem:
        raise ExportError(problem)
    cfg, state = trained.load(run_dir)
    if characters(cfg.dataset):
        # (transformers has no tokenizer class for a bare alphabet that GPT2's
        # AutoTokenizer would load; a model without one would read BPE ids)
        raise ExportError(f"{run_dir} is a character-level model ({cfg.dataset}): the Hugging "
                          "Face GPT-2 format carries GPT-2's BPE tokenizer, which would read "
                          "its tokens as others. Sample it with `make generate`")
    if not model_config(cfg).is_gpt2():
        raise ExportError(f"{run_dir} is not GPT-2's architecture (its CONFIG_MODEL_NORM, "
                          "_POSITION, _QK_NORM, _ATTENTION_SCALE, _ACTIVATION, "
                          "_EMBEDDING_NORM, _HEAD_BIAS or _LOGIT_CAP differ): the "
                          "Hugging Face GPT-2 format cannot hold it. Its weights are in the "
                          "run folder's checkpoint")
    rows = state["model"]["transformer.wte.weight"].shape[0]
    vocab = rows if keep_padded_vocab else min(rows, VOCAB_SIZE)
    tensors = pretrained.to_hf(state["model"], vocab, cfg.bias, cfg.tie_weights)
    summary = read_summary(run_dir)
    source = checkpoint.resolve(run_dir / trained.CKPT)
    record = {
        "run": str(run_dir.resolve()), "step": state["step"],
        "status": summary.status if summary and summary.status else "unfinished",
        "max_iters": state.get("max_iters"),
        "config_hash": state["config_hash"], "checkpoint": source.name,
        "checkpoint_sha256": checkpoint.recorded_sha256(source),
        "vocab_rows": {"kept": vocab, "in_the_run": rows},
        "not_exported": ["optimizer state", "pruning masks (pruned weights are zeros)",
                         "data position and random generators"]
                        + ([f"{rows - vocab} padded vocabulary rows"] if rows > vocab else []),
    }
    # Staged beside --out, then put in its place in one step; an existing empty folder
    # (someone's shared drop folder, a mount point) is kept, and staged in, its files
    # moved up with kgpt.json last.
    empty = out.is_dir() and not any(out.iterdir())
    make_folder(out if empty else out.parent)
    staged = new_folder(out / ".export" if empty else out)
    try:
        # (safetensors writes a file itself, where a full disk is an opaque
        # SafetensorError: its bytes go through kgpt's durable write instead.)
        write_bytes_atomic(staged / "model.safetensors", save(tensors, {"format": "pt"}))
        del tensors
        write_text_atomic(staged / "config.json",
                          json.dumps(hf_config(cfg, vocab), indent=2) + "\n")
        write_text_atomic(staged / "generation_config.json", json.dumps(
            {"bos_token_id": EOT_TOKEN, "eos_token_id": EOT_TOKEN}, indent=2) + "\n")
        write_tokenizer(staged, cfg.block_size)
        params = (summary.get("n_params") if summary else None) or sum(
            t.numel() for name, t in state["model"].items()
            if name != "lm_head.weight" or not cfg.tie_weights)
        write_text_atomic(staged / CARD, model_card(cfg, record, summary,
                                                    provenance.read(run_dir), params))
        write_text_atomic(staged / RECORD, json.dumps(record, indent=2) + "\n")
        if not empty:
            replace_folder(staged, out)
        elif any(p.name != staged.name for p in out.iterdir()):
            raise ExportError(f"--out {out} was empty, and files appeared in it meanwhile: "
                              "name a folder of the export's own")
        else:
            with writing(out, RESULTS_SETTING):
                for name in FILES:  # (RECORD last: the folder is an export once it is there)
                    os.replace(staged / name, out / name)
                fsync_dir(out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)  # (a folder this export made: new_folder)
    return record


def main(argv: list[str] | None = None) -> int:
    p = StrictArgumentParser(prog="gpt2/export.py", description=__doc__.split("\n")[0])
    p.add_argument("--run-dir", default="results/latest",
                   help="run folder holding ckpt.pt (default: results/latest)")
    p.add_argument("--out", help="folder to write (default: <run>/hf)")
    p.add_argument("--keep-padded-vocab", action="store_true",
                   help="keep kgpt's padded vocabulary rows (50304) instead of GPT-2's 50257")
    args = p.parse_args(argv)
    run_dir = Path(args.run_dir)
    out = Path(args.out) if args.out else run_dir / "hf"
    try:
        record = export(run_dir, out, args.keep_padded_vocab)
    except (CheckpointError, ConfigError, DataError, ExportError, StorageError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    unfinished = record["status"] != "completed"
    print(f"exported {run_dir} (step {record['step']}"
          + (f" of {record['max_iters']}, {record['status']}" if unfinished else "")
          + f") to {out}/ in Hugging Face format: vocabulary {record['vocab_rows']['kept']} "
          "rows\n  from transformers import GPT2LMHeadModel, AutoTokenizer\n"
          f"  model = GPT2LMHeadModel.from_pretrained({str(out)!r})\n"
          f"  tokenizer = AutoTokenizer.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    from gpt2.processes import survive_lost_terminal

    survive_lost_terminal()  # (what it prints shows control characters, never sends them)
    sys.exit(main())
