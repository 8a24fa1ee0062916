"""Tests for training/llama.py; need PyTorch (the GPU machine, or Debian's
python3-torch on a CPU machine): python3 training/test_llama.py"""
import unittest

try:
    import torch
except ImportError:  # pragma: no cover - depends on the machine
    torch = None

if torch is not None:
    import llama as L


def tiny_cfg(ffn):
    return {"vocab_size": 50, "hidden_size": 32, "intermediate_size": ffn, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 8, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "max_position_embeddings": 16}


@unittest.skipIf(torch is None, "PyTorch not installed: llama.py is tested on the GPU machine")
class TestGrowFFN(unittest.TestCase):
    def test_function_preserved(self):
        # (old ffn, new ffn): the grown blocks must compute what the old ones did.
        for old, new in [(48, 80), (48, 49), (16, 64)]:
            torch.manual_seed(old + new)
            m = L.Llama(tiny_cfg(old))
            m.init_weights()
            x = torch.randn(3, 5, 32)
            before = [layer.mlp(x) for layer in m.model.layers]
            L.grow_ffn(m, new)
            self.assertEqual(m.cfg["intermediate_size"], new)
            for layer, b in zip(m.model.layers, before):
                self.assertEqual(tuple(layer.mlp.gate_proj.weight.shape), (new, 32))
                self.assertEqual(tuple(layer.mlp.down_proj.weight.shape), (32, new))
                # Equal up to float32 summation order (a longer dot product).
                self.assertLess((layer.mlp(x) - b).abs().max().item(), 1e-6, (old, new))
                # The new units are not dead: their down_proj columns learn at once.
                layer.mlp(x).sum().backward()
                self.assertGreater(layer.mlp.down_proj.weight.grad[:, old:].abs().sum().item(), 0.0)

    def test_export_keys_unchanged(self):
        m = L.Llama(tiny_cfg(48))
        keys = set(m.hf_state_dict())
        L.grow_ffn(m, 64)
        self.assertEqual(set(m.hf_state_dict()), keys)

    def test_no_shrink(self):
        m = L.Llama(tiny_cfg(48))
        with self.assertRaises(AssertionError):
            L.grow_ffn(m, 48)


if __name__ == "__main__":
    unittest.main()
