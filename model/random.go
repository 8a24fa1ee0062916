package model

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// testChars are the synthetic test vocabulary's characters (~400): common
// characters of Spring Festival couplets, including the blessing words
// 平安 富贵 吉祥 如意 春 福 新 年 喜 庆, with both level (平) and oblique (仄)
// tones so couplet rules can be satisfied. Order is fixed: ids depend on it.
const testChars = "春福新年喜庆平安富贵吉祥如意财源广进万事兴旺家和乐康宁寿禄瑞雪梅花开迎门户红灯照" +
	"辞旧岁丰登五谷人民国泰山河大地天下好风光日月明星辉心想成竿头更上一层楼金玉满堂龙" +
	"马精神鸿运当高百业腾飞欢歌笑语盛世华章东南西北中秋冬夏雨露阳柳绿桃燕舞莺啼江水长" +
	"流云海松竹鹤鹿蛇虎兔鼠牛羊猴鸡狗猪德善美景良辰佳节气洋临四季八方来宝聚得蹄疾看尽" +
	"千里映村郭酒旗清白鸟香飘诗书礼义传承孝悌忠信勤俭持创图强祖繁荣昌时顺田园秀色青碧" +
	"波彩霞朝晖夕兆报三多鹊枝盈庭紫乾坤增象前程似锦绣跃凤九笙处声频李芬芳第积之必有余" +
	"致劳团圆合拱逐颜政通居物阜回到间同州共冰消化暖融暗又知乃发生随潜入夜润细无画壮志" +
	"凌宏展鹏学涯为径路关不住杏出墙举杯邀对影床疑是霜低思故乡首放须纵作伴还两个黄鹂鸣" +
	"翠行鹭窗含岭泊吴船远近各识庐面目只缘身在此爬问渠哪许活野火烧吹离原草枯吾恩情深谊" +
	"厚友朋亲邻酌古今论道文武双全才子若市车步煌播泽存祝愿贺隆霭接纳交斗极温梦智慧勇敢" +
	"灵奋"

// testPunct is the punctuation the training data keeps inside lines.
const testPunct = "，、；：！？·"

// testSpecials maps each chunlian.json role to its token text, in id order.
var testSpecials = []struct{ role, text string }{
	{"pad", "<pad>"}, {"unk", "<unk>"}, {"bos", "<bos>"}, {"eos", "<eos>"},
	{"keyword", "<kw>"}, {"acrostic", "<acr>"}, {"lower", "<low>"},
	{"up", "<up>"}, {"sep", "<sep>"}, {"banner", "<ban>"},
}

// testMaxLine is the synthetic model's max_line_length (<len_1>..<len_32>).
const testMaxLine = 32

// testVocab lists the synthetic tokenizer's tokens in id order: specials,
// length tokens, punctuation, characters. The first 10+testMaxLine entries
// are special.
func testVocab() (tokens []string, numSpecial int) {
	for _, s := range testSpecials {
		tokens = append(tokens, s.text)
	}
	for n := 1; n <= testMaxLine; n++ {
		tokens = append(tokens, fmt.Sprintf("<len_%d>", n))
	}
	numSpecial = len(tokens)
	seen := map[rune]bool{}
	for _, r := range testPunct + testChars {
		if !seen[r] {
			seen[r] = true
			tokens = append(tokens, string(r))
		}
	}
	return tokens, numSpecial
}

// TestMeta is the chunlian.json of the synthetic test model (the same roles,
// length tokens and layouts the trained model uses).
func TestMeta() Meta {
	m := Meta{
		Format:        1,
		SpecialTokens: map[string]string{},
		LengthToken:   "<len_%d>",
		MaxLineLength: testMaxLine,
		Layouts: map[string]string{
			"keyword":  "<bos> <kw> {keyword} {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>",
			"acrostic": "<bos> <acr> {heads} {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>",
			"lower":    "<bos> <low> {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>",
		},
	}
	for _, s := range testSpecials {
		m.SpecialTokens[s.role] = s.text
	}
	return m
}

// TestConfig is a tiny Llama config for tests: d=64, 2 layers, 4 query
// heads sharing 2 KV heads (GQA), SwiGLU width 176, untied LM head, and the
// synthetic test tokenizer's vocabulary size.
func TestConfig() Config {
	toks, _ := testVocab()
	return Config{
		VocabSize:        len(toks),
		HiddenSize:       64,
		IntermediateSize: 176,
		NumLayers:        2,
		NumHeads:         4,
		NumKVHeads:       2,
		HeadDim:          16,
		RMSNormEps:       1e-5,
		RopeTheta:        10000,
		MaxPositions:     256,
	}
}

// NewRandom builds a deterministic random model (same cfg and seed → same
// bits) with the synthetic test tokenizer and Meta. Weights are Gaussian with
// std 1/sqrt(fan_in) (embeddings std 1), norm weights near 1, so logits are
// O(1) and vary with context. If cfg.VocabSize exceeds the synthetic
// vocabulary the extra ids are special "<unused_N>" tokens (for benchmarks
// with a realistic vocabulary size); a smaller VocabSize panics. cfg must be
// valid (HeadDim and NumKVHeads set); it panics otherwise, as a programming
// error in a test.
func NewRandom(cfg Config, seed int64) *Model {
	if err := cfg.Validate(); err != nil {
		panic("model.NewRandom: " + err.Error())
	}
	toks, numSpecial := testVocab()
	if cfg.VocabSize < len(toks) {
		panic(fmt.Sprintf("model.NewRandom: VocabSize %d < %d synthetic tokens", cfg.VocabSize, len(toks)))
	}
	vocab := map[string]int32{}
	var added []AddedToken
	for i := 0; i < cfg.VocabSize; i++ {
		text := fmt.Sprintf("<unused_%d>", i)
		if i < len(toks) {
			text = toks[i]
		}
		if i < numSpecial || i >= len(toks) {
			added = append(added, AddedToken{ID: int32(i), Content: text, Special: true})
		}
		vocab[text] = int32(i)
	}
	tok, err := NewTokenizer(vocab, added)
	if err != nil {
		panic("model.NewRandom: " + err.Error())
	}
	tok.unk, _ = tok.ID("<unk>")

	rng := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	normal := func(n int, std float64) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * std)
		}
		return x
	}
	norm := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(1 + 0.1*rng.NormFloat64())
		}
		return x
	}
	d, q, kv, ffn, v := cfg.HiddenSize, cfg.QDim(), cfg.KVDim(), cfg.IntermediateSize, cfg.VocabSize
	sd, sq, sf := 1/math.Sqrt(float64(d)), 1/math.Sqrt(float64(q)), 1/math.Sqrt(float64(ffn))
	w := &Weights{Embed: normal(v*d, 1)}
	for i := 0; i < cfg.NumLayers; i++ {
		w.Layers = append(w.Layers, Layer{
			AttnNorm: norm(d),
			Wq:       normal(q*d, sd),
			Wk:       normal(kv*d, sd),
			Wv:       normal(kv*d, sd),
			Wo:       normal(d*q, sq),
			MLPNorm:  norm(d),
			WGate:    normal(ffn*d, sd),
			WUp:      normal(ffn*d, sd),
			WDown:    normal(d*ffn, sf),
		})
	}
	packLayers(w)
	w.FinalNorm = norm(d)
	if cfg.TieWordEmbeddings {
		w.LMHead = w.Embed
	} else {
		w.LMHead = normal(v*d, sd)
	}
	return &Model{Config: cfg, Weights: w, Tok: tok, Meta: TestMeta(), Name: fmt.Sprintf("random-%d", seed)}
}
