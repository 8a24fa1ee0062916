"""Self-critical sequence training (Rennie et al. 2017) for docs/EVAL.md's
BLEU: train.py --rl W adds W x this policy-gradient loss to each step.

Why. docs/EVAL.md scores the model's *greedy* 下联 by corpus BLEU-4, and
maximum likelihood does not aim at that: run 15's own width-16 beam scores
25 % above its greedy path (REPORT.md, "Run 18"), and training on that
beam's outputs moved the greedy path too slowly (run 18). Self-critical
training aims at the greedy path directly: sample K 下联s of a training
上联, score each against the real 下联, and raise the probability of the
samples that score above the model's own greedy 下联 (the baseline) and
lower the others'. A sample equal to the greedy one teaches nothing.

The reward is corpus BLEU-4 linearised around the model's current corpus:
with length forced, BP = 1 and log BLEU-4 = (1/4) sum_n log(M_n / T_n),
where M_n are the corpus's clipped n-gram matches and T_n (fixed by the
lengths) its hypothesis n-grams. A change of one line's matches by dm_n
changes log BLEU-4 by about sum_n dm_n / (4 M_n). So a line's reward is
sum_n m_n / (4 mbar_n), mbar_n being the mean matches of order n per line of
the greedy decodes (a running average over steps): a rare 4-gram match
counts ~10x a 1-gram match, as it does in BLEU-4. Sentence BLEU-4 would
give nothing to the many 7-character lines with no 4-gram match.

Only training pairs are decoded here (train.py's Data.pairs).

Measured (REPORT.md, "Runs 19 and 20"): it did not raise validation BLEU-4
from run 15, with either baseline, and a step took ~3.5x as long. On pairs
trained on for ~300 epochs the reward largely pays for memorised lines.

Shapes: b prompts of one line length n, K samples each; prompts int64
[b, P] (<bos> <low> <len_n> <up> U1..Un <sep>, P = n + 5).
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402
import distill  # noqa: E402
from pairs import amp, lower_prompts, subset  # noqa: E402

MAX_N = 4


@torch.no_grad()
def sample_lower(model, prompts, n, K, dev, temp=1.0, gen=None):
    """(greedy int64 [b, n], samples int64 [b, K, n]): the greedy 下联 and K
    samples at temperature temp, all of n characters with every special
    token forbidden (docs/EVAL.md's decoding; the greedy one is exactly
    distill.beam_lower's K=1). One prefill, then b*(K+1) rows share each
    cached step: row 0 of each prompt's block is greedy, rows 1..K sample."""
    b = prompts.shape[0]
    with amp(dev):
        lp, cache = distill.forward_cached(model, prompts.to(dev), None)
    rows = torch.arange(b, device=dev).repeat_interleave(K + 1)
    cache = [(k[rows], v[rows]) for k, v in cache]
    lp = lp[rows]
    greedy_row = (torch.arange(b * (K + 1), device=dev) % (K + 1)) == 0
    out = []
    for t in range(n):
        if t:
            with amp(dev):
                lp, cache = distill.forward_cached(model, out[-1][:, None], cache)
        lp[:, :C.NUM_SPECIAL] = -float("inf")
        pr = F.softmax(lp / temp, -1)
        s = torch.multinomial(pr, 1, generator=gen)[:, 0]
        out.append(torch.where(greedy_row, lp.argmax(-1), s))
    y = torch.stack(out, 1).reshape(b, K + 1, n)
    return y[:, 0], y[:, 1:]


def matches(hyps, refs):
    """Clipped n-gram matches float64 [len(hyps), MAX_N] of each hypothesis
    against its reference (id sequences), as corpus_bleu counts them."""
    return np.array([[m for m, _ in C.clipped_matches(list(h), list(r), MAX_N)]
                     for h, r in zip(hyps, refs, strict=True)], dtype=np.float64).reshape(-1, MAX_N)


class Reward:
    """Linearised corpus BLEU-4 (module docstring): reward(m) = sum_n
    m_n / (4 mbar_n). mbar_n is a running mean of the greedy decodes'
    matches per line; decay sets how fast it follows the model."""

    def __init__(self, decay=0.99, floor=1e-3):
        self.mbar = None
        self.decay, self.floor = decay, floor

    def observe(self, greedy_matches):
        m = greedy_matches.mean(0)
        self.mbar = m if self.mbar is None else self.decay * self.mbar + (1 - self.decay) * m

    def __call__(self, m):
        return (m / (MAX_N * np.maximum(self.mbar, self.floor))).sum(-1)


def seq_logprob(model, trunk, prompts, ys):
    """Summed log-probability float32 [r] of ys int64 [r, n] after prompts
    int64 [r, P] under model, specials excluded from the softmax as in
    sample_lower (the policy being trained). trunk: model.model, possibly
    compiled; gradients flow."""
    P, n = prompts.shape[1], ys.shape[1]
    x = torch.cat([prompts, ys], 1)
    h = trunk(x)[:, P - 1:-1]  # [r, n, d]: the positions that predict y_1..y_n
    lg = model.head(h).float()  # [r, n, V]
    special = torch.arange(lg.shape[-1], device=lg.device) < C.NUM_SPECIAL
    lg = lg.masked_fill(special, -float("inf"))
    return F.log_softmax(lg, -1).gather(-1, ys[..., None])[..., 0].sum(-1)


def policy_loss(model, trunk, prompts, samples, adv):
    """-mean(adv * log p(sample)) / n over the b*K samples (prompts [b, P],
    samples [b, K, n], adv float32 [b, K]): a per-character scale, like the
    cross-entropy it is added to."""
    b, K, n = samples.shape
    lp = seq_logprob(model, trunk, prompts.repeat_interleave(K, 0), samples.reshape(b * K, n))
    return -(adv.reshape(-1) * lp).mean() / n


def advantages(rs, rg, baseline):
    """rs float [b, K] the samples' rewards, rg [b] the greedy lines'.
    greedy: rs - rg (self-critical: only samples that beat the greedy line
    are raised). mean: rs - the mean of the prompt's other K-1 samples
    (leave-one-out; the advantages of a prompt sum to zero, so it does not
    push the whole distribution toward its mode as the greedy baseline does
    when most samples lose)."""
    if baseline == "greedy":
        return rs - rg[:, None]
    K = rs.shape[1]
    return rs - (rs.sum(1, keepdims=True) - rs) / (K - 1)


class SCST:
    """One self-critical term per train.py step, from the training pairs
    (groups: {n: pairs.Group}). Draws a line length with probability
    proportional to its pairs (as the epochs do), then `rows` pairs of it."""

    STATS = {"steps": 0, "adv_nonzero": 0.0, "greedy_reward": 0.0, "sample_reward": 0.0}  # sums since report()

    def __init__(self, groups, rows, K, temp, dev, rng, seed=0, baseline="greedy"):
        self.groups = groups
        self.lengths = np.array(sorted(groups))
        w = np.array([self.groups[n].U.shape[0] for n in self.lengths], dtype=np.float64)
        self.p = w / w.sum()
        assert baseline in ("greedy", "mean") and (baseline == "greedy" or K >= 2), (baseline, K)
        self.rows, self.K, self.temp, self.dev, self.rng = rows, K, temp, dev, rng
        self.baseline = baseline
        self.gen = torch.Generator(device=dev).manual_seed(seed)
        self.reward = Reward()
        self.stats = self.STATS.copy()

    def batch(self):
        n = int(self.rng.choice(self.lengths, p=self.p))
        g = self.groups[n]
        idx = self.rng.choice(g.U.shape[0], size=min(self.rows, g.U.shape[0]), replace=False)
        return n, lower_prompts(subset(g, idx), n).to(self.dev), g.L[idx]

    def loss(self, model, trunk):
        """(the policy loss with its graph, or None when no sample differs
        from its greedy line in reward)."""
        n, pre, refs = self.batch()
        was = model.training
        model.eval()  # sample from the model the export will be: no dropout
        try:
            greedy, samples = sample_lower(model, pre, n, self.K, self.dev, self.temp, self.gen)
        finally:
            model.train(was)
        gm = matches(greedy.cpu().numpy(), refs)
        sm = matches(samples.reshape(-1, n).cpu().numpy(), np.repeat(refs, self.K, 0))
        self.reward.observe(gm)
        rg, rs = self.reward(gm), self.reward(sm).reshape(-1, self.K)
        adv = advantages(rs, rg, self.baseline)
        s = self.stats
        s["steps"] += 1
        s["adv_nonzero"] += float((adv != 0).mean())
        s["greedy_reward"] += float(rg.mean())
        s["sample_reward"] += float(rs.mean())
        if not adv.any():
            return None
        adv = torch.from_numpy(adv).float().to(self.dev)
        with amp(self.dev):
            return policy_loss(model, trunk, pre, samples, adv)

    def report(self):
        """Means since the last report (for the training log), then reset."""
        s = self.stats
        k = max(s["steps"], 1)
        out = (f"rl: {s['steps']} steps, samples differing from greedy in reward {s['adv_nonzero'] / k:.2f}, "
               f"reward greedy {s['greedy_reward'] / k:.3f} samples {s['sample_reward'] / k:.3f}, "
               f"mbar {np.round(self.reward.mbar, 4).tolist() if self.reward.mbar is not None else None}")
        self.stats = self.STATS.copy()
        return out
