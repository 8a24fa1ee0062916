"""A plain-PyTorch Llama for training, with the parameter names of
transformers' LlamaForCausalLM so that its state dict exports unchanged.

Why not train transformers' module directly: it trained at 0.54-0.58 M
tokens/s on an H200. This module is small enough for torch.compile to fuse
(RMSNorm, RoPE, SwiGLU, residuals), and the training loss asks it for the
final hidden states only, so the 6,294-wide LM head runs on the target
positions alone (in lower mode about 40 % of the tokens).

The math is the one training/fixture.py's plain_llama documents (rotate-half
RoPE, RMSNorm in float32, SwiGLU, tied embeddings, no biases); train.py checks
it against transformers after every export (max |Δlogit| in float32).
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        # As transformers' LlamaRMSNorm: normalise in float32, cast back, scale.
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def attend(q, k, v):
    """Causal attention, q [B, H, T, hd], k and v [B, KVH, T, hd] -> [B, H, T, hd].
    PyTorch's fused kernel where it has one (2.5+ for grouped KV heads); the
    plain formula on older ones (Debian's python3-torch 1.13, which runs the
    CPU-side tools: calibrate.py, the tests)."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    T = q.shape[2]
    w = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # [B, H, T, T]
    w = w.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(w.float(), -1).to(v.dtype) @ v


class Attention(nn.Module):
    def __init__(self, d, heads, kv_heads, head_dim):
        super().__init__()
        self.h, self.kvh, self.hd = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(d, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(d, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, d, bias=False)

    def forward(self, x, cos, sin):
        # x [B, T, d]; cos, sin [T, hd]
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.hd).transpose(1, 2)  # [B, H, T, hd]
        k = self.k_proj(x).view(B, T, self.kvh, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kvh, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = attend(q, k, v)
        return self.o_proj(a.transpose(1, 2).reshape(B, T, self.h * self.hd))


class MLP(nn.Module):
    def __init__(self, d, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.self_attn = Attention(d, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])
        self.mlp = MLP(d, cfg["intermediate_size"])
        self.input_layernorm = RMSNorm(d, cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(d, cfg["rms_norm_eps"])
        self.dropout = cfg.get("dropout", 0.0)

    def forward(self, x, cos, sin):
        # Residual dropout (training only, cfg["dropout"], default 0): the
        # exported model has none, as transformers' Llama at inference.
        p = self.dropout if self.training else 0.0
        x = x + F.dropout(self.self_attn(self.input_layernorm(x), cos, sin), p)
        return x + F.dropout(self.mlp(self.post_attention_layernorm(x)), p)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), -1)


class Trunk(nn.Module):
    """Embedding → layers → final norm; named like LlamaModel ("model.")."""

    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        hd = cfg["head_dim"]
        theta = cfg["rope_theta"]
        inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        fr = torch.outer(torch.arange(cfg["max_position_embeddings"], dtype=torch.float32), inv)
        emb = torch.cat((fr, fr), -1)  # [P, hd]
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, ids):
        # ids [B, T] -> final hidden states [B, T, d]
        T = ids.shape[1]
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


class Llama(nn.Module):
    """LlamaForCausalLM's layout with tied embeddings: state_dict keys are
    model.* (+ lm_head.weight added by hf_state_dict)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Trunk(cfg)

    def head(self, h):
        # h [..., d] -> logits [..., V] (tied: the embedding matrix)
        return h @ self.model.embed_tokens.weight.t()

    def forward(self, ids):
        return self.head(self.model(ids))

    def init_weights(self, std=0.02):
        """transformers' Llama init: normal(0, std) for every matrix, ones for norms."""
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, 0.0, std)
            else:
                nn.init.ones_(p)

    def hf_state_dict(self):
        sd = {k: v for k, v in self.state_dict().items()}
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
        return sd


def cfg_from_hf(c):
    """The fields this module needs from a transformers LlamaConfig (object or dict)."""
    g = (lambda k, d=None: c.get(k, d)) if isinstance(c, dict) else (lambda k, d=None: getattr(c, k, d))
    rp = g("rope_parameters") or {}
    theta = rp.get("rope_theta") if isinstance(rp, dict) else None
    H = g("num_attention_heads")
    return {
        "vocab_size": g("vocab_size"), "hidden_size": g("hidden_size"),
        "intermediate_size": g("intermediate_size"), "num_hidden_layers": g("num_hidden_layers"),
        "num_attention_heads": H, "num_key_value_heads": g("num_key_value_heads") or H,
        "head_dim": g("head_dim") or g("hidden_size") // H, "rms_norm_eps": g("rms_norm_eps"),
        "rope_theta": theta or g("rope_theta", 10000.0),
        "max_position_embeddings": g("max_position_embeddings"),
    }


def grow_ffn(m, ffn, std=0.02, gen=None):
    """Widen every SwiGLU block of m to ffn hidden units without changing
    what m computes: the new gate/up rows are drawn normal(0, std) and the
    new down_proj columns are zero, so each new unit adds exactly 0 to the
    residual until training moves its down_proj column (which gets a
    gradient from the first step, since its input silu(g)*u is not 0).
    It tests whether capacity limits BLEU (training/README.md,
    "Experiments tried": it did not at the 40 MB limit)."""
    old = m.cfg["intermediate_size"]
    assert ffn > old, (ffn, old)
    for layer in m.model.layers:
        mlp = layer.mlp
        d = mlp.gate_proj.in_features
        new = MLP(d, ffn).to(mlp.gate_proj.weight.device, mlp.gate_proj.weight.dtype)
        with torch.no_grad():
            for name in ("gate_proj", "up_proj"):
                w = getattr(new, name).weight  # [ffn, d]
                w.normal_(0.0, std, generator=gen)
                w[:old] = getattr(mlp, name).weight
            new.down_proj.weight.zero_()  # [d, ffn]
            new.down_proj.weight[:, :old] = mlp.down_proj.weight
        layer.mlp = new
    m.cfg["intermediate_size"] = ffn
    return m


def load_dir(model_dir, dropout=0.0):
    """A Llama with the weights of an exported model directory (float32)."""
    from safetensors.torch import load_file
    cfg = dict(cfg_from_hf(json.load(open(os.path.join(model_dir, "config.json")))), dropout=dropout)
    m = Llama(cfg)
    sd = {k: t.float() for k, t in load_file(os.path.join(model_dir, "model.safetensors")).items()}
    sd.pop("lm_head.weight", None)  # tied
    missing, unexpected = m.load_state_dict(sd, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return m
