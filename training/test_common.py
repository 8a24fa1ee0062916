"""Tests for training/common.py (pure Python): python3 training/test_common.py"""
import json
import math
import os
import unittest

import common as C


class TestBleu(unittest.TestCase):
    def test_cases(self):
        # (hyps, refs, key, expected) with expected values worked out by hand.
        cases = [
            (["abcd"], ["abcd"], "bleu4", 1.0),
            (["abcd"], ["abce"], "p1", 3 / 4),
            (["abcd"], ["abce"], "p2", 2 / 3),
            (["abcd"], ["abce"], "bleu4", 0.0),  # p4 = 0, no smoothing
            (["abcd"], ["abce"], "bleu2", math.sqrt(3 / 4 * 2 / 3)),
            (["aaaa"], ["abca"], "p1", 2 / 4),  # clipping
            (["ab"], ["abcd"], "bp", math.exp(1 - 4 / 2)),  # brevity penalty
            (["abcd", "xy"], ["abcd", "xz"], "p1", 5 / 6),  # corpus-level sums
            (["abcd", "xy"], ["abcd", "xz"], "p2", 3 / 4),
        ]
        for hyps, refs, key, want in cases:
            got = C.corpus_bleu(hyps, refs)[key]
            self.assertAlmostEqual(got, want, places=12, msg=f"{hyps} {refs} {key}")


class TestRules(unittest.TestCase):
    PZ = {"雪": "仄", "春": "平", "年": "平", "福": "仄", "来": "平", "去": "仄"}

    def test_cases(self):
        cases = [
            ("瑞雪兆丰年", "春风迎新来", None, {"equal_length": True, "tone_up_ze_low_ping": False}),
            ("冬去", "春来", None, {"tone_up_ze_low_ping": True, "no_same_char_same_pos": True}),
            ("冬去", "冬来", None, {"no_same_char_same_pos": False}),
            ("天天好，去", "年年新，来", None, {"mirrored_punctuation": True, "mirrored_repetition": True}),
            ("天天好，去", "年月新，来", None, {"mirrored_repetition": False}),
            ("天天好，去", "年年新！来", None, {"mirrored_punctuation": False}),
            ("天天好去", "年年新来了", None, {"equal_length": False, "mirrored_punctuation": False}),
            ("平安是福", "吉祥如意", "平安", {"keyword_present": True}),
            ("平和是福", "吉安如意", "平安", {"keyword_present": False}),
        ]
        for up, low, kw, want in cases:
            got = C.rule_checks(up, low, self.PZ, kw)
            for k, v in want.items():
                self.assertEqual(got[k], v, msg=f"{up}/{low} {k}")


class TestLayout(unittest.TestCase):
    def test_shared_fixture(self):
        """The Go side (model/prompt.go) is tested against the same file."""
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "model", "testdata", "prompt_layouts.json")
        with open(path, encoding="utf-8") as f:
            cases = json.load(f)
        self.assertGreaterEqual(len(cases), 5)
        v = C.Vocab(list("平安春福风"))
        for c in cases:
            if c.get("full"):
                ids = C.full_ids(v, c["mode"], c.get("upper", ""), c.get("lower", ""), banner=c.get("banner", ""),
                                 keyword=c.get("keyword", ""), heads=c.get("heads", ""))
            else:
                ids = C.prompt_ids(v, c["mode"], c["length"], c.get("upper", ""), c.get("keyword", ""), c.get("heads", ""))
            self.assertEqual([v.itos[i] for i in ids], c["tokens"], msg=str(c))

    def test_ids(self):
        v = C.Vocab(list("平安春福"))
        a, b = C.NUM_SPECIAL, C.NUM_SPECIAL + 1
        self.assertEqual(C.prompt_ids(v, "keyword", 7, keyword="平安"), [C.BOS, C.KW, a, b, C.len_id(7), C.UP])
        self.assertEqual(C.full_ids(v, "lower", "春", "福", banner="平安春福"),
                         [C.BOS, C.LOW, C.len_id(1), C.UP, a + 2, C.SEP, a + 3, C.BAN, a, b, a + 2, a + 3, C.EOS])
        self.assertEqual(v.ids("春x"), [a + 2, C.UNK])
        self.assertEqual(C.SPECIALS[C.len_id(32)], "<len_32>")
        self.assertEqual(C.NUM_SPECIAL, 42)
        m = C.meta_json()
        self.assertEqual(set(m["special_tokens"]), {"pad", "unk", "bos", "eos", "keyword", "acrostic", "lower", "up", "sep", "banner"})


class TestModelVocab(unittest.TestCase):
    def write(self, d, tokens):
        import json
        import os
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump({"model": {"vocab": {t: i for i, t in enumerate(tokens)}}}, f, ensure_ascii=False)

    def test_reads_ids_in_order(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            self.write(d, C.SPECIALS + ["春", "风"])
            v = C.model_vocab(d)
        self.assertEqual(v.itos, C.SPECIALS + ["春", "风"])
        self.assertEqual(v.ids("风春"), [C.NUM_SPECIAL + 1, C.NUM_SPECIAL])

    def test_refuses_other_specials(self):
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            self.write(d, ["<x>"] + C.SPECIALS[1:] + ["春"])
            with self.assertRaises(AssertionError):
                C.model_vocab(d)


class TestLimitRows(unittest.TestCase):
    """limit_rows: a fixed subset, the same for every caller; rows itself
    when there is nothing to cut."""

    def test_fixed_subset(self):
        rows = [f"row{i}" for i in range(1000)]
        a, b = C.limit_rows(rows, 100), C.limit_rows(list(rows), 100)
        self.assertEqual(a, b)
        self.assertEqual(len(set(a)), 100)
        self.assertTrue(set(a) <= set(rows))
        self.assertNotEqual(a, rows[:100])
        self.assertEqual(rows, [f"row{i}" for i in range(1000)])  # input untouched

    def test_nothing_to_cut(self):
        rows = ["a", "b", "c"]
        for n in (0, 3, 5):
            self.assertIs(C.limit_rows(rows, n), rows)


if __name__ == "__main__":
    unittest.main()
