package model

import "fmt"

// The prompt layouts of chunlian.json (Meta.Layouts), built in one place
// for every Go caller (the couplet generator, the quality checks):
//
//	keyword:  <bos> <kw>  {keyword} {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>
//	acrostic: <bos> <acr> {heads}   {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>
//	lower:    <bos> <low>           {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>
//
// training/common.py (prompt_ids, full_ids) builds the same sequences;
// model/testdata/prompt_layouts.json is the fixture both sides are tested
// against.

// Layout modes (the keys of Meta.Layouts).
const (
	LayoutKeyword  = "keyword"
	LayoutAcrostic = "acrostic"
	LayoutLower    = "lower"
)

// PromptTokens are the special-token ids the layouts are made of.
type PromptTokens struct {
	BOS, EOS, Keyword, Acrostic, Lower, Up, Sep, Banner int32
}

// PromptTokens returns m's special-token ids for the layouts.
func (m *Model) PromptTokens() PromptTokens {
	return PromptTokens{
		BOS: m.Special("bos"), EOS: m.Special("eos"), Keyword: m.Special("keyword"),
		Acrostic: m.Special("acrostic"), Lower: m.Special("lower"), Up: m.Special("up"),
		Sep: m.Special("sep"), Banner: m.Special("banner"),
	}
}

// Prompt returns a layout's ids up to and including <up>, followed by
// upper and <sep> when upper is not empty: what a request feeds the model
// before it writes. heads are the keyword's (keyword) or the heads'
// (acrostic) ids, ignored in lower mode; length is the <len_N> id of the
// line.
func (t PromptTokens) Prompt(mode string, heads []int32, length int32, upper []int32) ([]int32, error) {
	out := make([]int32, 0, 6+len(upper)+1)
	switch mode {
	case LayoutKeyword:
		out = append(append(out, t.BOS, t.Keyword), heads...)
	case LayoutAcrostic:
		out = append(append(out, t.BOS, t.Acrostic), heads...)
	case LayoutLower:
		out = append(out, t.BOS, t.Lower)
	default:
		return nil, fmt.Errorf("model: unknown layout %q", mode)
	}
	out = append(out, length, t.Up)
	if len(upper) > 0 {
		out = append(append(out, upper...), t.Sep)
	}
	return out, nil
}

// Sequence returns a whole training sequence: Prompt with upper, then
// lower, <ban> and banner when banner is not empty, and <eos>.
func (t PromptTokens) Sequence(mode string, heads []int32, length int32, upper, lower, banner []int32) ([]int32, error) {
	out, err := t.Prompt(mode, heads, length, upper)
	if err != nil {
		return nil, err
	}
	out = append(out, lower...)
	if len(banner) > 0 {
		out = append(append(out, t.Banner), banner...)
	}
	return append(out, t.EOS), nil
}
