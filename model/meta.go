package model

// Meta is chunlian.json: the contract between the training script and the
// Go side about special tokens and prompt layouts. Every layout is a
// space-separated list of items; an item in braces is filled in by the
// caller ({keyword}, {heads}, {upper}, {lower}, {banner}: characters, one
// token each; {len}: the length token for the line length N, i.e.
// fmt.Sprintf(LengthToken, N)).
//
//	keyword:  <bos> <kw>  {keyword} {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>
//	acrostic: <bos> <acr> {heads}   {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>
//	lower:    <bos> <low>           {len} <up> {upper} <sep> {lower} <ban> {banner} <eos>
type Meta struct {
	Format int `json:"format"` // 1
	// SpecialTokens maps a role to its token text. Roles: pad, unk, bos, eos,
	// keyword, acrostic, lower, up, sep, banner.
	SpecialTokens map[string]string `json:"special_tokens"`
	// LengthToken is a fmt pattern with one %d, e.g. "<len_%d>", defined for
	// 1..MaxLineLength.
	LengthToken   string            `json:"length_token"`
	MaxLineLength int               `json:"max_line_length"`
	Layouts       map[string]string `json:"layouts"`
}
