#!/usr/bin/env python3
"""Train the chunlian couplet model (transformers' LlamaForCausalLM) on one
GPU and export the Hugging Face model directory the Go side loads.

    python3 training/train.py --data .carry/chunlian --out weights/chunlian-base --seed 1234 --minutes 7
    python3 training/train.py ... --steps N      # exact step count (the report says which N was used)

Input: the folder written by training/prep.py. Output dir: config.json,
model.safetensors (bf16), tokenizer.json, tokenizer_config.json,
generation_config.json, chunlian.json, banner_candidates.txt (copied from
--candidates if given), plus curve.csv and train.json (not shipped).

Examples and batching. Every couplet pair becomes one sequence per epoch in a
mode drawn at random (lower 50 %, keyword 30 % if the pair has a dictionary
word, else lower; acrostic 20 %), laid out as in model/meta.go. Real 横批
triples (x--triple-repeat per epoch) and a sample of pseudo-triples end
`<ban> B1..B4 <eos>`; all other pairs end `L1..LN <eos>`. Sequences with the
same length form batches of equal length, so there is no padding and no
attention mask (plain causal attention). The loss covers every token after
<up> (upper line, <sep>, lower line, banner, <eos>); the prompt itself
(<bos>, mode, keyword/heads, <len_N>, <up>) is not a target.

The exported checkpoint: --select nll (lowest validation NLL), bleu (highest
validation BLEU-4 under an NLL bound) or last (no selection: what the
shipped recipe uses, so that seeds compare without the bias of a maximum of
noisy checks).
"""
import argparse
import csv
import json
import math
import os
import random
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import llama as L  # noqa: E402
from pairs import amp, read_packed, read_rows, sequences, subset, to_groups  # noqa: E402
from valid import VAL_NLL_BOUND, val_bleu, val_calibrated, validate  # noqa: E402


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


# ---------------------------------------------------------------- data

class Data:
    def __init__(self, folder, v, args, rng):
        t0 = time.time()
        self.v, self.args = v, args
        rows = read_packed(folder, "pairs_train.tsv")
        if args.smoke:
            rows = rows[:20000]
        rows = C.limit_rows(rows, args.pairs_limit)
        self.pairs = to_groups(v, rows, False)
        self.n_pairs = len(rows)
        self.val = to_groups(v, read_rows(os.path.join(folder, "pairs_val.tsv.gz")), False)
        self.triples = to_groups(v, read_rows(os.path.join(folder, "triples_train.tsv")), True)
        prow = read_packed(folder, "pseudo_train.tsv")
        self.pseudo = to_groups(v, prow, True)
        self.n_pseudo = len(prow)
        self.extra = to_groups(v, read_rows(args.extra_triples), True) if args.extra_triples else {}
        log(f"data: {self.n_pairs} pairs, {len(prow)} pseudo-triples, "
            f"{sum(g.U.shape[0] for g in self.triples.values())} triples, "
            f"{sum(g.U.shape[0] for g in self.extra.values())} extra triples, loaded in {time.time() - t0:.1f}s")

    def epoch(self, rng):
        """One epoch as a shuffled list of (ids int32 [b, T], first_target)."""
        a = self.args
        seqs = {}  # T -> list of (array, first_target)

        def add(g, n, mix=a.mix):
            m = g.U.shape[0]
            r = rng.random(m)
            pl, pk, _ = (float(f) for f in mix.split(","))
            mode = np.where(r < pl, 0, np.where(r < pl + pk, 1, 2))
            mode[(mode == 1) & (g.kn == 0)] = 0
            for k, name in enumerate(("lower", "keyword", "acrostic")):
                idx = np.nonzero(mode == k)[0]
                if len(idx):
                    ids, ft = sequences(subset(g, idx), n, name, rng)
                    if name == "lower" and a.lower_targets == "lower":
                        ft += n + 1  # the upper line is given in lower mode: targets start at L1
                    seqs.setdefault((ids.shape[1], ft), []).append(ids)

        for n, g in self.pairs.items():
            add(g, n)
        spring = a.spring_mix or a.mix
        for n, g in self.triples.items():
            for _ in range(a.triple_repeat):
                add(g, n, spring)
        for n, g in self.extra.items():
            for _ in range(a.extra_repeat):
                add(g, n, spring)
        keep = a.pseudo_per_epoch / max(self.n_pseudo, 1)
        for n, g in self.pseudo.items():
            idx = np.nonzero(rng.random(g.U.shape[0]) < keep)[0]
            if len(idx):
                add(subset(g, idx), n, spring)
        batches = []
        for (T, ft), arrs in seqs.items():
            x = np.concatenate(arrs)
            x = x[rng.permutation(len(x))]
            b = max(1, a.batch_tokens // T)
            for i in range(0, len(x), b):
                batches.append((x[i:i + b], ft))
        order = rng.permutation(len(batches))
        return [batches[i] for i in order]


# ---------------------------------------------------------------- model

def make_config(vocab_size, args):
    from transformers import LlamaConfig
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=args.d, intermediate_size=args.ffn,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.heads, head_dim=args.d // args.heads,
        max_position_embeddings=128, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        bos_token_id=C.BOS, eos_token_id=C.EOS, pad_token_id=C.PAD,
        initializer_range=0.02,
    )


def loss_on(model, trunk, x, ft):
    """Mean cross-entropy of the tokens at positions >= ft (x: int64 [b, T])
    and the number of such tokens. trunk is model.model (its layers possibly
    compiled); the LM head runs on the target positions only."""
    h = trunk(x)[:, ft - 1:-1]  # [b, T-ft, d]
    tgt = x[:, ft:]
    lg = model.head(h).float()  # [b, T-ft, V]
    return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1)), tgt.numel()


# ---------------------------------------------------------------- export

def build_tokenizer(v):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import AddedToken
    tok = Tokenizer(models.WordLevel(vocab=dict(v.stoi), unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in C.SPECIALS])
    return tok


def export(model, v, out, args):
    """model: a llama.Llama; written as a transformers LlamaForCausalLM in
    bf16, then reloaded both ways and compared (the plain module must compute
    what transformers computes, and --init must read what export wrote)."""
    from transformers import GenerationConfig, LlamaForCausalLM
    os.makedirs(out, exist_ok=True)
    hf = LlamaForCausalLM(make_config(len(v), args))
    missing, unexpected = hf.load_state_dict({k: t.detach().cpu() for k, t in model.hf_state_dict().items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    hf.tie_weights()
    hf.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    check_export(out, v)
    tok = build_tokenizer(v)
    tok.save(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
                   "unk_token": "<unk>", "pad_token": "<pad>", "model_max_length": 128,
                   "clean_up_tokenization_spaces": False}, f, indent=1)
    GenerationConfig(bos_token_id=C.BOS, eos_token_id=C.EOS, pad_token_id=C.PAD, do_sample=False,
                     max_new_tokens=80).save_pretrained(out)
    with open(os.path.join(out, "chunlian.json"), "w", encoding="utf-8") as f:
        json.dump(C.meta_json(), f, ensure_ascii=False, indent=1)
    if args.candidates and os.path.exists(args.candidates):
        shutil.copy(args.candidates, os.path.join(out, "banner_candidates.txt"))
    # Self-checks of the contract: the tokenizer file loads and encodes a
    # keyword prompt to the ids the training used.
    from tokenizers import Tokenizer
    t2 = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    probe = "<bos><kw>平安<len_7><up>"
    got = t2.encode(probe).ids
    want = C.prompt_ids(v, "keyword", 7, keyword="平安")
    assert got == want, (got, want)
    assert t2.get_vocab_size() == len(v), (t2.get_vocab_size(), len(v))


@torch.no_grad()
def check_export(out, v):
    """transformers and llama.Llama, both loaded from out in float32 on the
    CPU, must give the same logits for a keyword prompt."""
    from transformers import LlamaForCausalLM
    hf = LlamaForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    mine = L.load_dir(out).eval()
    ids = torch.tensor([C.prompt_ids(v, "keyword", 7, keyword="平安") + v.ids("平安如意春常在")])
    a, b = hf(input_ids=ids).logits[0], mine(ids)[0]
    diff = (a - b).abs().max().item()
    log(f"export check: max |logit(transformers) - logit(llama.py)| = {diff:.2e}")
    assert diff < 1e-3, diff


# ---------------------------------------------------------------- main

def parse(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".carry/chunlian")
    ap.add_argument("--out", default="weights/chunlian-base")
    ap.add_argument("--candidates", default="weights/chunlian-base/banner_candidates.txt")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--minutes", type=float, default=7.0, help="training time budget (sets --steps after 60 steps)")
    ap.add_argument("--steps", type=int, default=0, help="exact number of optimizer steps (overrides --minutes)")
    ap.add_argument("--d", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--batch-tokens", type=int, default=65536)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.05)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--triple-repeat", type=int, default=20)
    ap.add_argument("--pseudo-per-epoch", type=int, default=20000)
    ap.add_argument("--extra-triples", default="",
                    help="more 横批 triples (upper, lower, banner, keyword; as triples_train.tsv), trained like "
                         "the real ones --extra-repeat times per epoch: training/data/written_triples.tsv")
    ap.add_argument("--extra-repeat", type=int, default=5)
    ap.add_argument("--pairs-limit", type=int, default=0,
                    help="train on a fixed random subset of this many pairs (0 = all of them; common.limit_rows, "
                         "the subset prep.py --pairs-limit writes)")
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--smoke", action="store_true", help="tiny data subset (pipeline check)")
    ap.add_argument("--init", default="", help="start from this exported model dir instead of a fresh init")
    ap.add_argument("--spring-mix", default="",
                    help="lower,keyword,acrostic shares for the spring-festival couplets (triples and pseudo-triples); "
                         "empty = --mix. With --mix 1,0,0 the keyword and acrostic modes learn 春联 only")
    ap.add_argument("--mix", default="0.5,0.3,0.2",
                    help="shares of lower, keyword, acrostic mode per epoch (keyword falls back to lower without a word)")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="residual dropout after attention and MLP while training (the model overfits without)")
    ap.add_argument("--ema", type=float, default=0.0,
                    help="keep an exponential moving average of the weights with this decay (e.g. 0.999); "
                         "validation, the best checkpoint and the export then use the average")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                    help="torch.compile the transformer trunk on the GPU")
    ap.add_argument("--calibrate", action=argparse.BooleanOptionalAction, default=True,
                    help="after the export, fit one logit scale on the validation pairs and bake it into "
                         "model.norm.weight (training/calibrate.py)")
    ap.add_argument("--select", choices=["nll", "bleu", "last"], default="nll",
                    help="checkpoint kept for export: lowest validation lower-line NLL, highest validation "
                         "BLEU-4 among those whose calibrated NLL is at most --select-max-nll, or the last one "
                         "(no selection: what a recipe gives, to compare seeds without the maximum's bias)")
    ap.add_argument("--select-max-nll", type=float, default=VAL_NLL_BOUND,
                    help="--select bleu: the calibrated validation NLL a checkpoint may have (valid.VAL_NLL_BOUND: "
                         "test runs ~0.024 nats below validation, so 3.015 keeps the test perplexity under 20)")
    ap.add_argument("--select-every", type=int, default=500, help="--select bleu: steps between BLEU checks")
    ap.add_argument("--lower-targets", choices=["upper", "lower"], default="upper",
                    help="lower-mode loss from U1 (upper) or from L1 (lower; the upper line is the given prompt)")
    return ap.parse_args(argv)


def train(args):
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    chars = json.load(open(os.path.join(args.data, "vocab.json"), encoding="utf-8"))["chars"]
    v = C.Vocab(chars)
    data = Data(args.data, v, args, rng)

    if args.init:
        model = L.load_dir(args.init, dropout=args.dropout).to(dev)
        assert model.cfg["vocab_size"] == len(v), (model.cfg["vocab_size"], len(v))
        assert (model.cfg["hidden_size"], model.cfg["num_hidden_layers"]) == (args.d, args.layers)
        log(f"initialised from {args.init}")
        if args.ffn != model.cfg["intermediate_size"]:
            # --ffn wider than --init's: grow it (function-preserving, see llama.grow_ffn).
            L.grow_ffn(model, args.ffn)
            log(f"grew the SwiGLU blocks to ffn {args.ffn} (new units start at zero output)")
    else:
        model = L.Llama(dict(L.cfg_from_hf(make_config(len(v), args)), dropout=args.dropout))
        model.init_weights()
        model = model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: vocab {len(v)}, d {args.d}, layers {args.layers}, heads {args.heads}, ffn {args.ffn}, "
        f"{n_params / 1e6:.2f}M params")
    trunk = model.model
    compiled = False
    if args.compile and dev.type == "cuda":
        # Regional compilation: the 8 identical layers share one compiled
        # graph (a whole-model compile takes minutes of the device call).
        # dynamic=True: batches differ in length T and in row count.
        import torch._dynamo as dynamo  # (a plain `import torch._dynamo` would make torch local here)
        dynamo.config.cache_size_limit = 64
        for layer in model.model.layers:
            layer.compile(dynamic=True)
        compiled = True
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    extra = {"fused": True} if dev.type == "cuda" else {}
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, **extra)

    # EMA of the weights (fp32, like the parameters): validated and exported
    # instead of the raw weights. swap() exchanges the two sets in place, so
    # the compiled layers keep their parameters' identity.
    params = [p for p in model.parameters()]
    ema = [p.detach().clone() for p in params] if args.ema > 0 else None

    def swap():
        if ema is not None:
            with torch.no_grad():
                for p, e in zip(params, ema):
                    t = p.detach().clone()
                    p.copy_(e)
                    e.copy_(t)

    def val_now():
        swap()
        try:
            return validate(model, data.val, dev)
        finally:
            swap()

    def snapshot():
        swap()
        try:
            return {k: t.detach().clone() for k, t in model.state_dict().items()}
        finally:
            swap()

    total = args.steps if args.steps > 0 else None
    budget = args.minutes * 60

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        T = total or 10 ** 9
        p = min(1.0, (step - args.warmup) / max(1, T - args.warmup))
        return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))

    os.makedirs(args.out, exist_ok=True)
    curve = open(os.path.join(args.out, "curve.csv"), "w", newline="")
    cw = csv.writer(curve)
    cw.writerow(["step", "epoch", "tokens", "seconds", "lr", "train_loss", "val_loss", "val_lower_nll"])
    step, epoch, tokens = 0, 0, 0
    t_start = time.time()
    t_mark = None
    run_loss, run_n = 0.0, 0
    best = (float("inf"), None, -1, float("nan"))  # (select_key, EMA state dict, step, val lower NLL)
    chosen = []  # (step, val lower NLL, calibrated NLL, val BLEU-4) of every --select bleu check

    def select_key(vlow, at):
        """Smaller is better. nll: the validation lower-line NLL. bleu: minus
        the validation BLEU-4 of the (EMA) weights; a checkpoint whose
        calibrated NLL is over --select-max-nll ranks after all that are not.
        last: minus the step, so the newest checkpoint always wins."""
        if args.select == "last":
            return -at
        if args.select == "nll":
            return vlow
        swap()
        try:
            s, cal = val_calibrated(model, data.val, dev)
            b = val_bleu(model, data.val, dev)["bleu4"]
        finally:
            swap()
        chosen.append((at, vlow, cal, b))
        log(f"select step {at}: val_lower {vlow:.4f}, calibrated {cal:.4f} (scale {s:.3f}), val BLEU-4 {b:.5f}")
        return -b if cal <= args.select_max_nll else 1e3 + cal  # over the limit: only if nothing is under it

    done = False
    if args.init:
        # The starting point is a candidate too: if no later validation beats
        # it, the export is the initial model (and the log says so).
        vl0, vlow0 = validate(model, data.val, dev)  # (EMA = weights at step 0)
        cw.writerow([0, 0, 0, "0.0", f"{lr_at(0):.3e}", "nan", f"{vl0:.4f}", f"{vlow0:.4f}"])
        log(f"step 0 (init) val {vl0:.4f} val_lower {vlow0:.4f} (ppl {math.exp(vlow0):.2f})")
        best = (select_key(vlow0, 0), {k: t.detach().clone() for k, t in model.state_dict().items()}, 0, vlow0)
    model.train()
    while not done:
        batches = data.epoch(rng)
        epoch += 1
        log(f"epoch {epoch}: {len(batches)} batches")
        for ids, ft in batches:
            x = torch.from_numpy(ids).to(dev, non_blocking=True).long()
            for g in opt.param_groups:
                g["lr"] = lr_at(step)
            try:
                with amp(dev):
                    loss, ntok = loss_on(model, trunk, x, ft)
                loss.backward()
            except Exception as e:  # a torch.compile failure must not cost the device call
                if not compiled:
                    raise
                log(f"torch.compile failed ({type(e).__name__}: {str(e)[:300]}); training eager")
                for layer in model.model.layers:
                    layer._compiled_call_impl = None
                compiled = False
                opt.zero_grad(set_to_none=True)
                with amp(dev):
                    loss, ntok = loss_on(model, trunk, x, ft)
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if ema is not None:
                # Short warm-up of the decay so early weights fade fast.
                with torch.no_grad():
                    torch._foreach_lerp_(ema, params, 1 - min(args.ema, (1 + step) / (10 + step)))
            step += 1
            tokens += x.numel()
            run_loss += loss.detach()
            run_n += 1
            if step == 20:
                torch.cuda.synchronize() if dev.type == "cuda" else None
                t_mark = (time.time(), tokens)
            if args.steps <= 0 and (step == 120 or (step > 120 and step % args.eval_every == 0)):
                # Time budget -> step count: the mean time per step since
                # step 20 (epoch building and validation included) sets the
                # remaining steps; re-estimated at every validation so that
                # the cosine schedule ends when the budget does.
                torch.cuda.synchronize() if dev.type == "cuda" else None
                dt = (time.time() - t_mark[0]) / (step - 20)
                total = max(step + 1, int((budget - (time.time() - t_start)) / dt) + step)
                if step == 120:
                    log(f"step time {dt * 1e3:.1f} ms -> total steps {total}")
            last = total is not None and step >= total
            if step % args.eval_every == 0 or last or (args.smoke and step % 10 == 0):
                vl, vlow = val_now()
                tl = float(run_loss / run_n) if run_n else float("nan")
                run_loss, run_n = 0.0, 0
                el = time.time() - t_start
                cw.writerow([step, epoch, tokens, f"{el:.1f}", f"{lr_at(step):.3e}", f"{tl:.4f}", f"{vl:.4f}", f"{vlow:.4f}"])
                curve.flush()
                log(f"step {step}/{total} ep {epoch} tok {tokens / 1e6:.1f}M lr {lr_at(step):.2e} "
                    f"train {tl:.4f} val {vl:.4f} val_lower {vlow:.4f} (ppl {math.exp(vlow):.2f}) "
                    f"{tokens / el / 1e6:.2f}M tok/s {el:.0f}s")
                if args.select == "nll" or step % args.select_every == 0 or last:
                    k = select_key(vlow, step)
                    if k < best[0]:
                        best = (k, snapshot(), step, vlow)
            if last:
                done = True
                break
    wall = time.time() - t_start
    curve.close()
    if ema is not None and best[1] is not None and best[2] == step:
        model.load_state_dict(best[1])  # the EMA weights, not the raw ones
    if best[1] is not None and best[2] != step:
        log(f"restoring best validation checkpoint from step {best[2]} ({args.select} key {best[0]:.4f})")
        model.load_state_dict(best[1])
    model = model.float()
    export(model, v, args.out, args)
    calib = None
    if args.calibrate:
        import calibrate
        calib = calibrate.calibrate(args.out, args.data, dev, log=log)
    info = {"compiled": compiled, "steps": step, "epochs_started": epoch, "tokens_seen": tokens, "train_seconds": round(wall, 1),
            "params": n_params, "best_step": best[2], "select": args.select, "select_checks": chosen,
            "val_lower_nll": best[3], "calibration": calib,
            "val_lower_ppl": math.exp(best[3]), "args": vars(args),
            "weights_bytes": os.path.getsize(os.path.join(args.out, "model.safetensors")),
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
    import transformers
    info["transformers"] = transformers.__version__
    with open(os.path.join(args.out, "train.json"), "w") as f:
        json.dump(info, f, indent=1)
    log("train done:", json.dumps({k: info[k] for k in ("steps", "tokens_seen", "train_seconds", "val_lower_ppl", "weights_bytes")}))
    return info


if __name__ == "__main__":
    train(parse())
