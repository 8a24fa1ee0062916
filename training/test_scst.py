"""Tests for training/scst.py: cd training && python3 test_scst.py
(the PyTorch parts skip without it; Debian's python3-torch is enough)."""
import math
import random
import unittest
from unittest import mock

import common as C

try:
    import numpy as np
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

if torch is not None:
    import distill
    import scst
    from pairs import Group, lower_prompts
    from test_distill import CHARS, prompts, stepwise, tiny


class TestReward(unittest.TestCase):
    def test_clipped_matches(self):
        cases = [  # hypothesis, reference, [(matches, n-grams) for n = 1..4]
            ("abcd", "abcd", [(4, 4), (3, 3), (2, 2), (1, 1)]),
            ("aaaa", "abca", [(2, 4), (0, 3), (0, 2), (0, 1)]),  # clipped to the reference's two a
            ("abab", "baba", [(4, 4), (2, 3), (2, 2), (0, 1)]),
            ("ab", "ab", [(2, 2), (1, 1), (0, 0), (0, 0)]),  # no 3- or 4-grams in a 2-character line
            ("xyzw", "abcd", [(0, 4), (0, 3), (0, 2), (0, 1)]),
        ]
        for h, r, want in cases:
            self.assertEqual(C.clipped_matches(list(h), list(r)), want, (h, r))

    @unittest.skipIf(torch is None, "PyTorch not installed (scst imports it)")
    def test_reward_is_first_order_corpus_log_bleu(self):
        """Changing one line of a corpus changes log BLEU-4 by about the
        change of its reward / the corpus's line count (Reward with mbar set
        to the corpus's mean matches per line)."""
        rnd = random.Random(5)
        refs = [[rnd.randrange(6) for _ in range(rnd.randrange(5, 10))] for _ in range(400)]
        hyps = [[t if rnd.random() < 0.6 else rnd.randrange(6) for t in r] for r in refs]
        r = scst.Reward()
        m = scst.matches(hyps, refs)
        r.observe(m)
        base = math.log(C.corpus_bleu(hyps, refs)["bleu4"])
        checked = 0
        for i in range(400):
            new = list(hyps[i])
            j = rnd.randrange(len(new))
            new[j] = refs[i][j] if new[j] != refs[i][j] else (new[j] + 1) % 6  # a match more or fewer
            h2 = hyps[:i] + [new] + hyps[i + 1:]
            exact = math.log(C.corpus_bleu(h2, refs)["bleu4"]) - base
            lin = (r(scst.matches([new], [refs[i]]))[0] - r(m[i:i + 1])[0]) / len(refs)
            if exact == 0.0:  # clipping kept every count: no reward change either
                self.assertEqual(lin, 0.0, i)
                continue
            self.assertAlmostEqual(lin / exact, 1.0, delta=0.05, msg=(i, exact, lin))
            checked += 1
        self.assertGreater(checked, 300)

    @unittest.skipIf(torch is None, "PyTorch not installed")
    def test_rare_orders_weigh_more(self):
        r = scst.Reward()
        r.observe(np.array([[2.0, 0.5, 0.2, 0.1]]))
        one = [r(np.array([[1.0 if k == n else 0.0 for k in range(4)]]))[0] for n in range(4)]
        self.assertEqual(sorted(one), one)  # a 4-gram match is worth most
        self.assertAlmostEqual(one[3] / one[0], 20.0)


    @unittest.skipIf(torch is None, "PyTorch not installed")
    def test_advantages(self):
        rs = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 3.0]])
        rg = np.array([2.0, 1.0])
        np.testing.assert_allclose(scst.advantages(rs, rg, "greedy"), [[-1, 0, 1], [-1, -1, 2]])
        mean = scst.advantages(rs, rg, "mean")  # minus the mean of the other two samples
        np.testing.assert_allclose(mean, [[-1.5, 0, 1.5], [-1.5, -1.5, 3]])
        np.testing.assert_allclose(mean.sum(1), 0)


@unittest.skipIf(torch is None, "PyTorch not installed: scst.py is tested where it is")
class TestSampling(unittest.TestCase):
    dev = torch.device("cpu") if torch is not None else None

    def test_greedy_row_is_the_greedy_lower_and_samples_are_legal(self):
        m = tiny(3)
        n, b, K = 5, 6, 8
        x = prompts(n, b, 4)
        g = torch.Generator().manual_seed(0)
        greedy, samples = scst.sample_lower(m, x, n, K, self.dev, gen=g)
        want, _ = distill.beam_lower([m], x, n, 1, self.dev)
        self.assertTrue(torch.equal(greedy, want))
        self.assertEqual(tuple(samples.shape), (b, K, n))
        self.assertTrue(bool((samples >= C.NUM_SPECIAL).all()))
        self.assertTrue(bool((samples < C.NUM_SPECIAL + CHARS).all()))
        self.assertFalse(bool((samples == greedy[:, None]).all()))  # they do sample
        # At a temperature near 0 every sample is the greedy line.
        _, cold = scst.sample_lower(m, x, n, K, self.dev, temp=1e-4, gen=g)
        self.assertTrue(torch.equal(cold, greedy[:, None].expand(-1, K, -1)))

    def test_seq_logprob_is_the_sampling_policy(self):
        """seq_logprob's probability of a sample is the product of the
        softmaxes sample_lower drew it from (specials excluded)."""
        m = tiny(1)
        n, b = 4, 3
        x = prompts(n, b, 2)
        _, s = scst.sample_lower(m, x, n, 2, self.dev, gen=torch.Generator().manual_seed(1))
        ys = s[:, 0]
        with torch.no_grad():
            got = scst.seq_logprob(m, m.model, x, ys)
            _, want = stepwise(m, x, n, lambda t, lp: ys[:, t])
        self.assertLess((got - want).abs().max().item(), 1e-4)


@unittest.skipIf(torch is None, "PyTorch not installed: scst.py is tested where it is")
class TestLearning(unittest.TestCase):
    def train_toward(self, sign, baseline="greedy"):
        """A tiny model, 60 steps of SCST.loss alone (what train.py --rl
        adds to each step) on one group of pairs with fixed reference lines.
        Returns the mean greedy reward before and after, with fixed weights
        (a Reward observed once on the initial greedy lines). sign=-1
        reverses every advantage."""
        dev = torch.device("cpu")
        m = tiny(7).train()
        n, b, K = 5, 16, 8
        g = torch.Generator().manual_seed(2)
        U = torch.randint(C.NUM_SPECIAL, C.NUM_SPECIAL + CHARS, (b, n), generator=g).numpy().astype(np.int32)
        refs = torch.randint(C.NUM_SPECIAL, C.NUM_SPECIAL + CHARS, (b, n), generator=g).numpy().astype(np.int32)
        group = Group(U, refs, np.zeros((b, 6, 2), np.int32), np.zeros(b, np.int32))
        x = lower_prompts(group, n)
        rl = scst.SCST({n: group}, b, K, 1.0, dev, np.random.default_rng(3), seed=4, baseline=baseline)

        def greedy_reward():
            greedy, _ = scst.sample_lower(m, x, n, 1, dev)
            return fixed(scst.matches(greedy.numpy(), refs)).mean()

        fixed = scst.Reward(decay=1.0)  # mbar fixed at the first observation
        greedy, _ = scst.sample_lower(m, x, n, 1, dev)
        fixed.observe(np.maximum(scst.matches(greedy.numpy(), refs), 0.5))
        before = greedy_reward()
        opt = torch.optim.Adam(m.parameters(), lr=3e-3)
        adv = scst.advantages
        with mock.patch.object(scst, "advantages", lambda rs, rg, bl: sign * adv(rs, rg, bl)):
            for _ in range(60):
                loss = rl.loss(m, m.model)
                if loss is None:
                    continue
                opt.zero_grad()
                loss.backward()
                opt.step()
        self.assertTrue(m.training)  # loss() samples in eval mode and restores the mode
        return before, greedy_reward()

    def test_greedy_reward_rises(self):
        before, after = self.train_toward(+1)
        self.assertGreater(after, before * 1.5 + 0.2, (before, after))

    def test_greedy_reward_rises_with_the_mean_baseline(self):
        before, after = self.train_toward(+1, "mean")
        self.assertGreater(after, before * 1.5 + 0.2, (before, after))

    def test_reversed_advantage_does_not(self):
        """The same loop with the advantage's sign flipped (a broken
        baseline) must not raise the greedy reward: the test above can fail."""
        before, after = self.train_toward(-1)
        self.assertLessEqual(after, before + 0.05, (before, after))


if __name__ == "__main__":
    unittest.main()
