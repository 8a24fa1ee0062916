"""Tests for training/distill.py: cd training && python3 test_distill.py
(skips without PyTorch; Debian's python3-torch is enough)."""
import itertools
import unittest

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

if torch is not None:
    import common as C
    import distill
    import llama as L

CHARS = 5  # characters after the 42 special tokens


def no_grad(f):
    """torch.no_grad() as a decorator, and nothing without PyTorch (the
    class body below is evaluated even when its tests are skipped)."""
    return f if torch is None else torch.no_grad()(f)


def tiny(seed):
    torch.manual_seed(seed)
    m = L.Llama({"vocab_size": C.NUM_SPECIAL + CHARS, "hidden_size": 32, "intermediate_size": 48,
                 "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
                 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 32})
    m.init_weights(std=0.5)  # large weights: peaked, seed-dependent distributions
    return m.eval()


def prompts(n, b, seed):
    g = torch.Generator().manual_seed(seed)
    U = torch.randint(C.NUM_SPECIAL, C.NUM_SPECIAL + CHARS, (b, n), generator=g)
    head = torch.tensor([C.BOS, C.LOW, C.len_id(n), C.UP])
    return torch.cat([head.expand(b, -1), U, torch.full((b, 1), C.SEP)], 1)


def full_logprob(models, x, start):
    """Sum over positions >= start of log(mean over models of p(token)),
    by whole-sequence forward passes (no cache)."""
    lps = torch.stack([F.log_softmax(m(x).float(), -1) for m in models])  # [M, b, T, V]
    lp = torch.logsumexp(lps, 0) - torch.log(torch.tensor(float(len(models))))
    return lp[:, start - 1:-1].gather(-1, x[:, start:, None])[..., 0].sum(-1)


def stepwise(m, x, n, pick):
    """n tokens after x by whole-sequence forwards (no cache), specials
    excluded: pick(t, log-probabilities float32 [b, V]) -> tokens [b].
    Returns (the tokens int64 [b, n], their summed log-probability [b])."""
    seq, tot = x, torch.zeros(x.shape[0])
    for t in range(n):
        lg = m(seq)[:, -1].float()
        lg[:, :C.NUM_SPECIAL] = -float("inf")
        lp = F.log_softmax(lg, -1)
        y = pick(t, lp)
        tot += lp.gather(-1, y[:, None])[:, 0]
        seq = torch.cat([seq, y[:, None]], 1)
    return seq[:, x.shape[1]:], tot


@unittest.skipIf(torch is None, "PyTorch not installed: distill.py is tested where it is")
class TestBeam(unittest.TestCase):
    dev = torch.device("cpu") if torch is not None else None

    @no_grad
    def test_cached_step_matches_full_forward(self):
        m = tiny(1)
        x = prompts(4, 3, 2)
        lp, cache = distill.forward_cached(m, x[:, :6], None)
        want = F.log_softmax(m(x[:, :6])[:, -1].float(), -1)
        self.assertLess((lp - want).abs().max().item(), 1e-4)
        for t in range(6, x.shape[1]):  # one token at a time after the prefill
            lp, cache = distill.forward_cached(m, x[:, t:t + 1], cache)
            want = F.log_softmax(m(x[:, :t + 1])[:, -1].float(), -1)
            self.assertLess((lp - want).abs().max().item(), 1e-4, t)

    @no_grad
    def test_greedy_is_argmax_path(self):
        m = tiny(3)
        n = 5
        x = prompts(n, 4, 4)
        got, _ = distill.beam_lower([m], x, n, 1, self.dev)
        want, _ = stepwise(m, x, n, lambda t, lp: lp.argmax(-1))
        self.assertTrue(torch.equal(got, want))

    @no_grad
    def test_wide_beam_finds_the_best_sequence(self):
        # With K ≥ CHARS^(n-1) no hypothesis is ever pruned that could win,
        # so the beam must return the exact maximum over all CHARS^n lowers.
        # Checked for one model and for an ensemble of two.
        for models in ([tiny(5)], [tiny(5), tiny(6)]):
            n = 3
            x = prompts(n, 3, 7)
            got, score = distill.beam_lower(models, x, n, CHARS ** (n - 1), self.dev)
            for r in range(x.shape[0]):
                cands = torch.tensor(list(itertools.product(range(C.NUM_SPECIAL, C.NUM_SPECIAL + CHARS), repeat=n)))
                seqs = torch.cat([x[r].expand(len(cands), -1), cands], 1)
                lp = full_logprob(models, seqs, x.shape[1])
                best = lp.argmax()
                self.assertEqual(got[r].tolist(), cands[best].tolist(), (len(models), r))
                self.assertAlmostEqual(score[r].item(), lp[best].item(), places=3)

    @no_grad
    def test_beam_never_scores_below_greedy(self):
        m = tiny(8)
        n = 6
        x = prompts(n, 16, 9)
        g, gs = distill.beam_lower([m], x, n, 1, self.dev)
        b, bs = distill.beam_lower([m], x, n, 4, self.dev)
        self.assertTrue(bool((bs >= gs - 1e-4).all()))
        self.assertFalse(torch.equal(g, b), "a width-4 beam changed no row: the test has no power")
        for seq, s in ((g, gs), (b, bs)):  # the returned scores are the sequences' log-probabilities
            full = full_logprob([m], torch.cat([x, seq], 1), x.shape[1])
            self.assertLess((full - s).abs().max().item(), 1e-3)

    @no_grad
    def test_ensemble_of_one_model_twice_is_the_model(self):
        m = tiny(10)
        x = prompts(4, 5, 11)
        a, sa = distill.beam_lower([m], x, 4, 3, self.dev)
        b, sb = distill.beam_lower([m, m], x, 4, 3, self.dev)
        self.assertTrue(torch.equal(a, b))
        self.assertLess((sa - sb).abs().max().item(), 1e-4)


@unittest.skipIf(torch is None, "PyTorch not installed: distill.py is tested where it is")
class TestMake(unittest.TestCase):
    @no_grad
    def test_lines_follow_the_rows(self):
        # Rows of mixed lengths, interleaved: make decodes them by length,
        # and line i must still be row i's 上联 and its own beam 下联.
        import os
        import tempfile
        m = tiny(12)
        v = C.Vocab(list("春风花雨山"))  # CHARS characters
        rows = [["春风花", "山雨春", ""], ["雨山", "风花", ""], ["花花春雨", "山山风雨", ""],
                ["风春山", "雨花风", ""], ["山雨", "春风", ""]]
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "kd.tsv")
            distill.make([m], v, rows, 3, torch.device("cpu"), out, batch=1)
            with open(out, encoding="utf-8") as f:
                lines = [line.rstrip("\n").split("\t") for line in f]
        self.assertEqual([ln[0] for ln in lines], [r[0] for r in rows])
        for r, (_, low) in zip(rows, lines):
            n = len(r[0])
            x = torch.tensor([C.prompt_ids(v, "lower", n, r[0])])
            want, _ = distill.beam_lower([m], x, n, 3, torch.device("cpu"))
            self.assertEqual(low, v.text(want[0].tolist()), r[0])


@unittest.skipIf(torch is None, "PyTorch not installed: train.py is tested where it is")
class TestTrainKD(unittest.TestCase):
    """train.py --kd: the share --kd-frac of the training pairs carries the
    teacher's 下联 in an epoch, the rest the real one; --swap-frac: that
    share of lower-mode pairs is drawn reversed."""

    def epoch_lowers(self, frac, swap=0.0):
        import gzip
        import os
        import tempfile

        import numpy as np
        import train
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = tmp.name
        chars = "春风花雨山水月明天地人和"
        rng = np.random.default_rng(0)
        rows = []
        for i in range(400):
            n = 3 + i % 3
            u = "".join(rng.choice(list(chars), n))
            rows.append((u, "".join(rng.choice(list(chars), n)), "".join(rng.choice(list(chars), n))))
        with gzip.open(os.path.join(d, "pairs_train.tsv.gz"), "wt", encoding="utf-8") as f:
            f.writelines(f"{u}\t{low}\t\n" for u, low, _ in rows)
        with gzip.open(os.path.join(d, "pairs_val.tsv.gz"), "wt", encoding="utf-8") as f:
            f.write("春风\t明月\t\n")
        with gzip.open(os.path.join(d, "pseudo_train.tsv.gz"), "wt", encoding="utf-8") as f:
            f.write("春风\t明月\t山水花月\t\n")
        with open(os.path.join(d, "triples_train.tsv"), "w", encoding="utf-8") as f:
            f.write("春风\t明月\t山水花月\t\n")
        kd = os.path.join(d, "kd.tsv")
        with open(kd, "w", encoding="utf-8") as f:
            f.writelines(f"{u}\t{k}\n" for u, _, k in rows)
        args = train.parse(["--data", d, "--kd", kd, "--kd-frac", str(frac), "--swap-frac", str(swap), "--mix", "1,0,0",
                            "--triple-repeat", "0", "--pseudo-per-epoch", "0", "--lower-targets", "lower"])
        v = C.Vocab(sorted(set(chars)))
        data = train.Data(d, v, args, np.random.default_rng(1))
        real = {(u, low) for u, low, _ in rows}
        teacher = {(u, k) for u, _, k in rows}
        reversed_ = {(low, u) for u, low, _ in rows}
        got = {"real": 0, "teacher": 0, "reversed": 0}
        for x, ft in data.epoch(np.random.default_rng(2)):
            n = ft - 5  # lower targets: after <bos> <low> <len> <up> U1..Un <sep>
            for r in x:
                u, low = v.text(r[4:4 + n]), v.text(r[ft:ft + n])
                if (u, low) in teacher and (u, low) not in real:
                    got["teacher"] += 1
                elif (u, low) in real and (u, low) not in teacher:
                    got["real"] += 1
                elif (u, low) in reversed_ and (u, low) not in real and (u, low) not in teacher:
                    got["reversed"] += 1  # --swap-frac: the 下联 given, the 上联 the target
                else:
                    self.fail(f"pair {u}/{low} is neither (or both)")
        return got

    def test_share(self):
        for frac, lo, hi in [(0.0, 0, 0), (1.0, 400, 400), (0.5, 150, 250)]:
            got = self.epoch_lowers(frac)
            self.assertEqual(got["real"] + got["teacher"], 400, frac)
            self.assertTrue(lo <= got["teacher"] <= hi, (frac, got))

    def test_swap_share(self):
        """--swap-frac reverses that share of the lower-mode pairs."""
        for swap, lo, hi in [(0.0, 0, 0), (1.0, 400, 400), (0.3, 80, 160)]:
            got = self.epoch_lowers(0.0, swap)
            self.assertEqual(got["real"] + got["reversed"], 400, swap)
            self.assertTrue(lo <= got["reversed"] <= hi, (swap, got))


if __name__ == "__main__":
    unittest.main()
