#!/usr/bin/env python3
"""Data preparation for the chunlian couplet model (runs on the CPU machine,
pure Python 3, no third-party packages).

Reads the corpora under --data (../shared/data, never committed), writes the
prepared, gzipped training set to --out (default .carry/chunlian, git-ignored)
so that it can travel to the GPU machine with the device tool's `carry`, and
writes the shipped banner candidate list (MIT, derived from idioms.txt) to
weights/chunlian-base/banner_candidates.txt.

Everything is deterministic for a given --seed.

Output files (all UTF-8, TAB-separated, one example a line):
  pairs_train.tsv.xz  upper  lower  kws     (kws: space-separated 2-char words)
  pairs_val.tsv.gz    upper  lower  kws     (held out from train+extra for the loss curve)
  triples_train.tsv   upper  lower  banner  kws   (real 横批 triples, order fixed)
  triples_eval.tsv    upper  lower  banner        (held-out real triples: banner ranking eval)
  pseudo_train.tsv.xz upper  lower  banner  kws   (spring couplets + overlap-chosen banner)
  test.tsv            copy of couplets/test.tsv (evaluation only, never trained on)
  banners.txt         copy of spring/banners.txt (evaluation/pseudo labels only; not shipped)
  pingze.tsv          char  class(平/仄)  for the vocabulary (from tones/, MIT)
  vocab.json          {"chars": [...], "threshold": T, ...}
  stats.json          counts for training/README.md
"""
import argparse
import collections
import glob
import gzip
import json
import lzma
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common as C  # noqa: E402

MAX_LEN = 32
PUNCT = set("，、；：！？·")

# Characters that mark a 4-character idiom as a plausible 横批 (auspicious,
# festive or scenic) and characters that rule one out (death, disaster,
# misfortune, vice). Hand-written lists; see training/README.md.
GOOD = set(
    "春福喜吉祥瑞安康寿财富贵兴旺泰和顺乐庆丰新华盛美满乾坤"
    "德善仁孝勤俭龙凤鹏腾飞辉光锦绣圆欢欣荣昌隆宏鸿佳祯祺禧"
    "如意恒宁雅睦艳悦歌舞盈"
)
BAD = set(
    "死亡败丧哀悲苦病灾祸凶恶鬼贼愁怨泪血杀毒奸忧惨痛残暴"
    "穷贫饿寒孤寡亏损失误骗盗乱虐狂疯傻蠢丑耻辱惧怕惊恐慌"
    "衰弱落破碎绝灭葬墓坟尸骨魔妖邪淫伤害枯朽腐臭废弃离散"
    "哭啼泣叹怒骂嫌厌疾瘟蝎狼狈豺醉迷贪欲妄假虚空不非莫未"
    "罪苟酒迟暮抹此而已问敌捂冻麻妆你我他她汝吾谁何哉乎矣焉兮"
)


def load_pairs(path):
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) < 2:
                continue
            out.append(tuple(parts))
    return out


def jieba_two_char_words(min_freq):
    """Two-character CJK words of jieba's dictionary (MIT, shipped in the npm
    package nodejieba 3.5.8 as submodules/cppjieba/dict/jieba.dict.utf8),
    fetched with `npm pack` into a temporary folder."""
    tmp = tempfile.mkdtemp(prefix="jieba")
    subprocess.run(["npm", "pack", "nodejieba@3.5.8"], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tgz = glob.glob(os.path.join(tmp, "nodejieba-*.tgz"))[0]
    words = {}
    with tarfile.open(tgz) as tf:
        f = tf.extractfile("package/submodules/cppjieba/dict/jieba.dict.utf8")
        for line in f.read().decode("utf-8").splitlines():
            p = line.split()
            if len(p) < 2 or len(p[0]) != 2:
                continue
            w, freq = p[0], int(p[1])
            if freq >= min_freq and all("\u4e00" <= c <= "\u9fff" for c in w):
                words[w] = max(freq, words.get(w, 0))
    shutil.rmtree(tmp)
    return words


def keywords_of(upper, lower, words, rng, cap):
    """Distinct dictionary words (2 chars) that occur in the upper or lower
    line; at most cap of them, chosen at random."""
    found = set()
    for line in (upper, lower):
        for i in range(len(line) - 1):
            w = line[i:i + 2]
            if w in words:
                found.add(w)
    found = sorted(found)
    if len(found) > cap:
        found = rng.sample(found, cap)
    return " ".join(found)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="../shared/data")
    ap.add_argument("--out", default=".carry/chunlian")
    ap.add_argument("--weights", default="weights/chunlian-base")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--val", type=int, default=5000)
    ap.add_argument("--min-char-count", type=int, default=3)
    ap.add_argument("--min-word-freq", type=int, default=20)
    ap.add_argument("--banner-eval", type=int, default=25)
    ap.add_argument("--pairs-limit", type=int, default=0,
                    help="write a fixed random subset of this many training pairs (common.limit_rows; 0 = all): "
                         "the full file and the tracked weights together exceed the device tool's carry")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.out, exist_ok=True)
    os.makedirs(args.weights, exist_ok=True)
    D = args.data
    stats = {}

    # Tones: primary class of the primary reading (README: use the primary class).
    pz = {}
    with open(os.path.join(D, "tones/char_pingze_modern.tsv"), encoding="utf-8") as f:
        for line in f:
            p = line.rstrip("\n").split("\t")
            pz[p[0]] = p[2]

    # Couplet pairs: train + extra, lines of at most MAX_LEN chars.
    files = [os.path.join(D, "couplets/train.tsv")] + sorted(glob.glob(os.path.join(D, "couplets/extra/*.tsv")))
    pairs, dropped = [], 0
    for fn in files:
        for p in load_pairs(fn):
            if len(p[0]) > MAX_LEN:
                dropped += 1
                continue
            pairs.append((p[0], p[1]))
    stats["pairs_total"] = len(pairs)
    stats["pairs_dropped_longer_than_32"] = dropped
    test = load_pairs(os.path.join(D, "couplets/test.tsv"))
    test_set = set((u, l) for u, l in test)
    assert not any(p in test_set for p in pairs), "test pair in training data"
    rng.shuffle(pairs)
    val, train = pairs[:args.val], pairs[args.val:]
    val_set = set(val)
    stats["pairs_train"], stats["pairs_val"] = len(train), len(val)

    # Real triples: fix line order by the tone rule (上联 ends 仄, 下联 ends 平).
    triples, swapped, non4 = [], 0, 0
    for u, l, b in load_pairs(os.path.join(D, "spring/with_banner.tsv")):
        if pz.get(u[-1]) == "平" and pz.get(l[-1]) == "仄":
            u, l = l, u
            swapped += 1
        if len(b) != 4 or len(u) > MAX_LEN:
            non4 += 1
            continue
        triples.append((u, l, b))
    rng.shuffle(triples)
    tri_eval, tri_train = triples[:args.banner_eval], triples[args.banner_eval:]
    stats.update(triples_swapped=swapped, triples_not_4_chars=non4,
                 triples_train=len(tri_train), triples_eval=len(tri_eval))

    banners = [b.strip() for b in open(os.path.join(D, "spring/banners.txt"), encoding="utf-8") if b.strip()]

    # Vocabulary: characters seen at least T times in the training pairs; the
    # chars of real banners and of banners.txt are added so that banner
    # scoring never hits <unk>.
    cnt = collections.Counter()
    for u, l in train:
        cnt.update(u)
        cnt.update(l)
    chars = set(c for c, k in cnt.items() if k >= args.min_char_count)
    for u, l, b in triples:
        chars.update(u + l + b)
    for b in banners:
        chars.update(b)
    chars = sorted(chars, key=lambda c: (-cnt[c], c))
    vocab_set = set(chars)
    stats["vocab_chars"] = len(chars)
    tot = sum(cnt.values())
    stats["char_coverage_train"] = sum(cnt[c] for c in chars) / tot

    # Banner candidates (shipped, MIT): 4-char idioms with an auspicious
    # character, no inauspicious one, all chars in the vocabulary.
    idioms = [w.strip() for w in open(os.path.join(D, "idioms.txt"), encoding="utf-8") if w.strip()]
    cands = []
    for w in idioms:
        if len(w) == 4 and all(c in vocab_set for c in w) and any(c in GOOD for c in w) and not any(c in BAD for c in w):
            cands.append(w)
    stats["banner_candidates"] = len(cands)
    with open(os.path.join(args.weights, "banner_candidates.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(cands) + "\n")

    # Keywords from jieba's dictionary.
    words = jieba_two_char_words(args.min_word_freq)
    stats["jieba_two_char_words"] = len(words)

    def kw(u, l):
        return keywords_of(u, l, words, rng, 6)

    nokw = 0
    lines = []
    for u, l in train:
        k = kw(u, l)
        nokw += not k
        lines.append(f"{u}\t{l}\t{k}\n")
    lines = C.limit_rows(lines, args.pairs_limit)
    # xz, not gzip: 21.3 MB at preset 9e (23.1 MB at 6, 33.6 MB gzipped), to
    # keep the carried data small beside the repo in the device tool's 64 MiB
    # (with the spring model tracked too, only a --pairs-limit subset fits).
    # It costs ~2 minutes more here.
    with lzma.open(os.path.join(args.out, "pairs_train.tsv.xz"), "wt", encoding="utf-8",
                   preset=9 | lzma.PRESET_EXTREME) as f:
        f.writelines(lines)
    stats["pairs_train_without_keyword"] = nokw
    with gzip.open(os.path.join(args.out, "pairs_val.tsv.gz"), "wt", encoding="utf-8") as f:
        for u, l in val:
            f.write(f"{u}\t{l}\t{kw(u, l)}\n")
    with open(os.path.join(args.out, "triples_train.tsv"), "w", encoding="utf-8") as f:
        for u, l, b in tri_train:
            f.write(f"{u}\t{l}\t{b}\t{kw(u, l)}\n")
    with open(os.path.join(args.out, "triples_eval.tsv"), "w", encoding="utf-8") as f:
        for u, l, b in tri_eval:
            f.write(f"{u}\t{l}\t{b}\n")

    # Pseudo-triples: spring couplets (newyear_no_banner, minus val/test and
    # the held-out triples) with the banners.txt entry or banner candidate
    # that shares the most distinct characters with the couplet (at least 2;
    # ties broken at random).
    pool = sorted(set(banners) | set(cands))
    pool = [b for b in pool if len(b) == 4 and all(c in vocab_set for c in b)]
    index = collections.defaultdict(list)
    for i, b in enumerate(pool):
        for c in set(b):
            index[c].append(i)
    held = set((u, l) for u, l, _ in tri_eval)
    spring = load_pairs(os.path.join(D, "spring/newyear_no_banner.tsv"))
    npseudo = 0
    # xz at 9e like pairs_train: 2.0 MB instead of 2.8 MB gzipped, for the same limit.
    with lzma.open(os.path.join(args.out, "pseudo_train.tsv.xz"), "wt", encoding="utf-8",
                   preset=9 | lzma.PRESET_EXTREME) as f:
        for p in spring:
            u, l = p[0], p[1]
            if len(u) > MAX_LEN or (u, l) in val_set or (u, l) in test_set or (u, l) in held:
                continue
            score = collections.Counter()
            for c in set(u + l):
                for i in index.get(c, ()):
                    score[i] += 1
            if not score:
                continue
            best = max(score.values())
            if best < 2:
                continue
            b = pool[rng.choice(sorted(i for i, s in score.items() if s == best))]
            f.write(f"{u}\t{l}\t{b}\t{kw(u, l)}\n")
            npseudo += 1
    stats["pseudo_triples"] = npseudo

    shutil.copy(os.path.join(D, "couplets/test.tsv"), os.path.join(args.out, "test.tsv"))
    shutil.copy(os.path.join(D, "spring/banners.txt"), os.path.join(args.out, "banners.txt"))
    with open(os.path.join(args.out, "pingze.tsv"), "w", encoding="utf-8") as f:
        for c in sorted(set(chars) | set("".join(u + l for u, l in test))):
            if c in pz:
                f.write(f"{c}\t{pz[c]}\n")
    with open(os.path.join(args.out, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({"chars": chars, "threshold": args.min_char_count, "seed": args.seed}, f, ensure_ascii=False)
    with open(os.path.join(args.out, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, ensure_ascii=False, indent=1)
    json.dump(stats, sys.stdout, ensure_ascii=False, indent=1)
    print()


if __name__ == "__main__":
    main()
