"""Tests for training/calibrate.py and valid.py; need PyTorch (the GPU machine, or
Debian's python3-torch on a CPU machine): python3 training/test_calibrate.py"""
import json
import os
import tempfile
import unittest

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

if torch is not None:
    import bf16st
    import calibrate
    import common as C
    import llama as L
    import pairs
    import valid

CHARS = "天地春秋山水花月风雨"


def tiny_cfg(vocab):
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 4, "head_dim": 8, "rms_norm_eps": 1e-5, "max_position_embeddings": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "tie_word_embeddings": True}


def write_dir(d, model, cfg):
    """The model as an exported directory: config.json + bf16 model.safetensors."""
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
    head, blobs, off = {}, [], 0
    for k, t in model.hf_state_dict().items():
        b = bf16st.to_bf16(t.detach().float().numpy()).tobytes()
        head[k] = {"dtype": "BF16", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    bf16st.write(os.path.join(d, "model.safetensors"), head, b"".join(blobs))


@unittest.skipIf(torch is None, "PyTorch or numpy not installed: calibrate.py is tested on the GPU machine "
                 "or with Debian's python3-torch")
class TestCalibrate(unittest.TestCase):
    def setUp(self):
        torch.manual_seed(7)
        rng = np.random.default_rng(7)
        self.v = C.Vocab(CHARS)
        self.cfg = tiny_cfg(len(self.v))
        m = L.Llama(dict(L.cfg_from_hf(self.cfg), dropout=0.0))
        m.init_weights()
        # Confident and wrong enough that the best scale is not 1.
        with torch.no_grad():
            m.model.norm.weight.mul_(3.0)
        self.dir = tempfile.mkdtemp()
        write_dir(self.dir, m, self.cfg)
        rows = []
        for n in (3, 5):
            for _ in range(20):
                rows.append(["".join(rng.choice(list(CHARS), n)), "".join(rng.choice(list(CHARS), n))])
        self.groups = pairs.to_groups(self.v, rows, False)

    def direct_nll(self, model, s):
        """The lower lines' mean NLL at logit scale s, one pair at a time."""
        tot = n = 0.0
        for length, g in self.groups.items():
            for i in range(g.U.shape[0]):
                ids = C.prompt_ids(self.v, "lower", length) + list(g.U[i]) + [C.SEP] + list(g.L[i]) + [C.EOS]
                x = torch.tensor([ids])
                lp = F.log_softmax(model(x)[0].double() * s, -1)
                for p in range(len(ids) - length - 1, len(ids)):  # L1 .. <eos>
                    tot -= lp[p - 1, ids[p]].item()
                    n += 1
        return tot / n

    def test_nll_by_scale_matches_direct(self):
        m = calibrate.load_model(self.dir)
        got = valid.nll_by_scale(m, self.groups, torch.device("cpu"), [0.5, 1.0, 1.7])
        for s, g in zip([0.5, 1.0, 1.7], got):
            self.assertAlmostEqual(g, self.direct_nll(m, s), places=5, msg=f"scale {s}")
        # validate's lower-line figure is the same quantity at scale 1.
        self.assertAlmostEqual(valid.validate(m, self.groups, torch.device("cpu"))[1], got[1], places=5)

    def test_fit_is_a_minimum(self):
        m = calibrate.load_model(self.dir)
        s, at1, best = valid.fit(m, self.groups, torch.device("cpu"))
        self.assertNotEqual(s, 1.0)
        self.assertLess(best, at1)
        near = valid.nll_by_scale(m, self.groups, torch.device("cpu"), [s - 0.002, s, s + 0.002])
        self.assertLess(near[1], near[0])
        self.assertLess(near[1], near[2])
        self.assertAlmostEqual(best, self.direct_nll(m, s), places=5)

    def test_scale_norm_scales_the_logits(self):
        before = calibrate.load_model(self.dir)
        other = {k: v for k, v in bf16st.read(os.path.join(self.dir, "model.safetensors"))[0].items()
                 if k != calibrate.NORM}
        calibrate.scale_norm(self.dir, 0.8)
        after = calibrate.load_model(self.dir)
        x = torch.tensor([C.prompt_ids(self.v, "keyword", 5, keyword="春秋") + self.v.ids("天地")])
        with torch.no_grad():
            a, b = before(x), after(x)
        # bf16 rounding of norm·0.8: within 2^-8 relative per element.
        self.assertLess((b - 0.8 * a).abs().max().item(), 0.01 * a.abs().max().item())
        self.assertGreater((b - a).abs().max().item(), 0.05 * a.abs().max().item())
        # Every other tensor keeps its place and bytes.
        h2, _, _ = bf16st.read(os.path.join(self.dir, "model.safetensors"))
        self.assertEqual(other, {k: v for k, v in h2.items() if k != calibrate.NORM})
        for k in ("model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight"):
            self.assertTrue(torch.equal(before.state_dict()[k], after.state_dict()[k]), k)


    def test_val_bleu_matches_one_pair_at_a_time(self):
        m = calibrate.load_model(self.dir)
        hyps, refs = [], []
        for length, g in sorted(self.groups.items()):
            for i in range(g.U.shape[0]):
                ids = C.prompt_ids(self.v, "lower", length) + list(g.U[i]) + [C.SEP]
                for _ in range(length):
                    with torch.no_grad():
                        lg = m(torch.tensor([ids]))[0, -1]
                    lg[:C.NUM_SPECIAL] = -float("inf")
                    ids.append(int(lg.argmax()))
                hyps.append(ids[-length:])
                refs.append(list(g.L[i]))
        self.assertGreater(len({t for h in hyps for t in h}), 3)  # not one token everywhere
        self.assertEqual(valid.val_greedy(m, self.groups, torch.device("cpu"), rows=7), (hyps, refs))
        self.assertEqual(valid.val_bleu(m, self.groups, torch.device("cpu")), C.corpus_bleu(hyps, refs))


if __name__ == "__main__":
    unittest.main()
