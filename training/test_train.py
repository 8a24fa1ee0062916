"""Tests for training/train.py's epochs: cd training && python3 test_train.py
(skips without PyTorch, which train.py imports; Debian's python3-torch is enough)."""
import gzip
import os
import tempfile
import unittest

import common as C

try:
    import numpy as np
    import torch  # noqa: F401  (train.py needs it)

    import train
except ImportError:
    train = None

CHARS = "春风花雨山水月明天地人和"


@unittest.skipIf(train is None, "PyTorch not installed: train.py is tested where it is")
class TestEpoch(unittest.TestCase):
    """An epoch in lower mode holds every training pair exactly once, laid
    out as model/meta.go says, with targets from L1 (--lower-targets lower)."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        d = self.dir = tmp.name
        rng = np.random.default_rng(0)
        self.rows = []
        for i in range(400):
            n = 3 + i % 3
            self.rows.append(("".join(rng.choice(list(CHARS), n)), "".join(rng.choice(list(CHARS), n))))
        with gzip.open(os.path.join(d, "pairs_train.tsv.gz"), "wt", encoding="utf-8") as f:
            f.writelines(f"{u}\t{low}\t\n" for u, low in self.rows)
        with gzip.open(os.path.join(d, "pairs_val.tsv.gz"), "wt", encoding="utf-8") as f:
            f.write("春风\t明月\t\n")
        with gzip.open(os.path.join(d, "pseudo_train.tsv.gz"), "wt", encoding="utf-8") as f:
            f.write("春风\t明月\t山水花月\t\n")
        with open(os.path.join(d, "triples_train.tsv"), "w", encoding="utf-8") as f:
            f.write("春风\t明月\t山水花月\t\n")

    def test_lower_epoch_holds_every_pair_once(self):
        args = train.parse(["--data", self.dir, "--mix", "1,0,0", "--triple-repeat", "0",
                            "--pseudo-per-epoch", "0", "--lower-targets", "lower"])
        v = C.Vocab(sorted(set(CHARS)))
        data = train.Data(self.dir, v, args, np.random.default_rng(1))
        got = []
        for x, ft in data.epoch(np.random.default_rng(2)):
            n = ft - 5  # lower targets: after <bos> <low> <len_N> <up> U1..Un <sep>
            for r in x:
                self.assertEqual(list(r[:4]), C.prompt_ids(v, "lower", n)[:4])
                got.append((v.text(r[4:4 + n]), v.text(r[ft:ft + n])))
        self.assertEqual(sorted(got), sorted(self.rows))

    def test_extra_triples_and_pairs_limit(self):
        """--extra-triples come --extra-repeat times per epoch, each ending in
        its banner; --pairs-limit keeps that many distinct pairs."""
        extra = os.path.join(self.dir, "extra.tsv")
        with open(extra, "w", encoding="utf-8") as f:
            f.write("春风花\t明月水\t山水花月\t春风\n天地人\t山水月\t花月春风\t\n")
        args = train.parse(["--data", self.dir, "--mix", "1,0,0", "--spring-mix", "1,0,0", "--triple-repeat", "0",
                            "--pseudo-per-epoch", "0", "--lower-targets", "lower", "--extra-triples", extra,
                            "--extra-repeat", "3", "--pairs-limit", "100"])
        v = C.Vocab(sorted(set(CHARS)))
        data = train.Data(self.dir, v, args, np.random.default_rng(1))
        pairs, banners = set(), []
        for x, ft in data.epoch(np.random.default_rng(2)):
            n = ft - 5
            for r in x:
                if len(r) > ft + n + 1 and r[ft + n] == C.BAN:
                    banners.append(v.text(r[ft + n + 1:ft + n + 5]))
                else:
                    pairs.add((v.text(r[4:4 + n]), v.text(r[ft:ft + n])))
        self.assertEqual(sorted(banners), ["山水花月"] * 3 + ["花月春风"] * 3)
        self.assertEqual(len(pairs), 100)
        self.assertTrue(pairs <= set(self.rows))


if __name__ == "__main__":
    unittest.main()
