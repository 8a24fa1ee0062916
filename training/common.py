"""Shared definitions for the chunlian training scripts: special tokens, the
prompt layouts of model/meta.go, the couplet rules and corpus BLEU.

Pure Python (no torch), so that it can be tested on the CPU machine:
`python3 training/test_common.py`.
"""
import collections
import json
import math
import os
import random

MAX_LINE = 32
PUNCT = set("，、；：！？·")

# Special tokens, in id order. Ids 0..9 are the roles of chunlian.json, then
# <len_1>..<len_32> (ids 10..41), then the characters.
ROLES = [
    ("pad", "<pad>"), ("unk", "<unk>"), ("bos", "<bos>"), ("eos", "<eos>"),
    ("keyword", "<kw>"), ("acrostic", "<acr>"), ("lower", "<low>"),
    ("up", "<up>"), ("sep", "<sep>"), ("banner", "<ban>"),
]
LENGTH_TOKEN = "<len_%d>"
SPECIALS = [t for _, t in ROLES] + [LENGTH_TOKEN % n for n in range(1, MAX_LINE + 1)]
PAD, UNK, BOS, EOS, KW, ACR, LOW, UP, SEP, BAN = range(10)
NUM_SPECIAL = len(SPECIALS)  # 42


# PAIRS_LIMIT_SEED draws limit_rows's subset, independent of any run's
# --seed, so that prep.py and train.py (--pairs-limit) cut the same pairs.
PAIRS_LIMIT_SEED = 5


def limit_rows(rows, n):
    """A fixed random subset of n of rows, in the drawn order (rows itself
    when n is 0 or not below len(rows))."""
    if not 0 < n < len(rows):
        return rows
    rows = list(rows)
    random.Random(PAIRS_LIMIT_SEED).shuffle(rows)
    return rows[:n]


def len_id(n):
    assert 1 <= n <= MAX_LINE, n
    return 10 + n - 1


LAYOUTS = {
    "keyword": "<bos> <kw> {keyword} {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>",
    "acrostic": "<bos> <acr> {heads} {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>",
    "lower": "<bos> <low> {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>",
}


def meta_json():
    """chunlian.json, exactly the fields of model/meta.go."""
    return {
        "format": 1,
        "special_tokens": {role: tok for role, tok in ROLES},
        "length_token": LENGTH_TOKEN,
        "max_line_length": MAX_LINE,
        "layouts": LAYOUTS,
    }


class Vocab:
    """Token <-> id. Characters come after the 42 special tokens."""

    def __init__(self, chars):
        self.itos = list(SPECIALS) + list(chars)
        self.stoi = {t: i for i, t in enumerate(self.itos)}
        assert len(self.stoi) == len(self.itos), "duplicate token"

    def __len__(self):
        return len(self.itos)

    def ids(self, text):
        return [self.stoi.get(c, UNK) for c in text]

    def text(self, ids):
        return "".join(self.itos[i] if i >= NUM_SPECIAL else "" for i in ids)


def model_vocab(model_dir):
    """The Vocab of an exported model directory, from its tokenizer.json
    (ids 0..41 must be SPECIALS, in order)."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        vocab = json.load(f)["model"]["vocab"]
    itos = [None] * len(vocab)
    for t, i in vocab.items():
        itos[i] = t
    assert itos[:NUM_SPECIAL] == SPECIALS, f"{model_dir}: the first {NUM_SPECIAL} ids are not common.SPECIALS"
    return Vocab(itos[NUM_SPECIAL:])


def prompt_ids(v, mode, n, upper="", keyword="", heads=""):
    """Token ids of a prompt up to and including <up> (+ the given upper
    line and <sep> when upper is not empty)."""
    ids = [BOS]
    if mode == "keyword":
        ids += [KW] + v.ids(keyword)
    elif mode == "acrostic":
        ids += [ACR] + v.ids(heads)
    elif mode == "lower":
        ids += [LOW]
    else:
        raise ValueError(mode)
    ids += [len_id(n), UP]
    if upper:
        ids += v.ids(upper) + [SEP]
    return ids


def full_ids(v, mode, upper, lower, banner="", keyword="", heads=""):
    ids = prompt_ids(v, mode, len(upper), upper, keyword, heads) + v.ids(lower)
    if banner:
        ids += [BAN] + v.ids(banner)
    return ids + [EOS]


# ---- couplet rules (definitions in docs/EVAL.md) ----

def rule_checks(upper, lower, pingze, keyword=None):
    """Returns a dict rule -> bool for one couplet. Position-wise rules are
    checked over the common prefix when the lengths differ (and then
    equal_length already fails)."""
    n = min(len(upper), len(lower))
    r = {"equal_length": len(upper) == len(lower) and len(upper) > 0}
    r["mirrored_punctuation"] = r["equal_length"] and all(
        (upper[i] in PUNCT) == (lower[i] in PUNCT) and (upper[i] not in PUNCT or upper[i] == lower[i])
        for i in range(n))
    r["tone_up_ze_low_ping"] = bool(upper) and bool(lower) and \
        pingze.get(upper[-1]) == "仄" and pingze.get(lower[-1]) == "平"
    r["no_same_char_same_pos"] = n > 0 and all(upper[i] != lower[i] for i in range(n) if upper[i] not in PUNCT)
    idx = [i for i in range(n) if upper[i] not in PUNCT and lower[i] not in PUNCT]
    r["mirrored_repetition"] = n > 0 and all(
        (upper[i] == upper[j]) == (lower[i] == lower[j]) for a, i in enumerate(idx) for j in idx[a + 1:])
    if keyword is not None:
        r["keyword_present"] = keyword in upper or keyword in lower
    return r


def rule_rates(results):
    """results: list of dicts from rule_checks -> rule -> pass rate."""
    tot = collections.Counter()
    cnt = collections.Counter()
    for r in results:
        for k, ok in r.items():
            tot[k] += 1
            cnt[k] += bool(ok)
    return {k: cnt[k] / tot[k] for k in tot}


# ---- corpus BLEU (character tokens, uniform weights, no smoothing) ----

def _ngrams(seq, n):
    return collections.Counter(tuple(seq[i:i + n]) for i in range(len(seq) - n + 1))


def clipped_matches(h, ref, max_n=4):
    """[(clipped matches, hypothesis n-grams) for n = 1..max_n] of one
    hypothesis against one reference (sequences of tokens): corpus_bleu's
    sums."""
    out = []
    for n in range(1, max_n + 1):
        hn, rn = _ngrams(h, n), _ngrams(ref, n)
        out.append((sum(min(k, rn[g]) for g, k in hn.items()), max(len(h) - n + 1, 0)))
    return out


def corpus_bleu(hyps, refs, max_n=4):
    """Corpus-level BLEU over character sequences with one reference each:
    modified n-gram precisions p_n = sum of clipped matches / sum of
    hypothesis n-grams over the whole corpus, BP = 1 if c > r else
    exp(1 - r/c) (c, r: total hypothesis and reference lengths), BLEU-N =
    BP * exp(mean_{n<=N} log p_n); 0 if any p_n is 0. Returns
    {"bleu1".."bleu4", "p1".."p4", "bp", "hyp_len", "ref_len"}."""
    match = [0] * (max_n + 1)
    total = [0] * (max_n + 1)
    c = r = 0
    for h, ref in zip(hyps, refs, strict=True):
        h, ref = list(h), list(ref)
        c += len(h)
        r += len(ref)
        for n, (m, t) in enumerate(clipped_matches(h, ref, max_n), 1):
            match[n] += m
            total[n] += t
    out = {"hyp_len": c, "ref_len": r}
    out["bp"] = 1.0 if c > r else (math.exp(1 - r / c) if c > 0 else 0.0)
    logs = []
    for n in range(1, max_n + 1):
        p = match[n] / total[n] if total[n] else 0.0
        out[f"p{n}"] = p
        logs.append(math.log(p) if p > 0 else None)
        out[f"bleu{n}"] = 0.0 if any(x is None for x in logs) else out["bp"] * math.exp(sum(logs) / n)
    return out


BLESSINGS = (
    "平安 吉祥 如意 幸福 安康 富贵 发财 兴旺 团圆 和睦 长寿 健康 快乐 美满 顺利 "
    "丰收 繁荣 昌盛 大吉 鸿运 迎春 新春 春风 瑞雪 福星 金玉 满堂 万事 和谐 腾飞 "
    "锦绣 辉煌 喜庆 欢乐 祥和 康宁 如春 财源 五福 四季 家和 国泰 民安 盛世 新年 "
    "春光 花开 龙腾 梅香 燕舞"
).split()
