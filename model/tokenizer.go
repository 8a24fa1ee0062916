package model

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// Tokenizer is a character-level WordLevel tokenizer read from a Hugging Face
// tokenizers file (tokenizer.json): every vocabulary entry is one character
// except the added tokens (special tokens such as <bos> and <len_7>), which
// may be longer. It is immutable after construction and safe for concurrent
// use.
type Tokenizer struct {
	vocab   map[string]int32
	tokens  []string // id → text; "" for ids the file leaves undefined
	special []bool   // id → is a special token (skipped by Decode)
	// addedByFirst maps a first byte to the multi-character added tokens
	// starting with it, longest first, so Encode can
	// recognise "<bos>" in text before falling back to single characters.
	addedByFirst map[byte][]string
	unk          int32 // -1 when the file names no unk_token
}

// AddedToken is one entry of tokenizer.json's added_tokens.
type AddedToken struct {
	ID         int32  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type tokenizerFile struct {
	AddedTokens []AddedToken `json:"added_tokens"`
	Model       struct {
		Type     string           `json:"type"`
		Vocab    map[string]int32 `json:"vocab"`
		UnkToken string           `json:"unk_token"`
	} `json:"model"`
}

// ParseTokenizer reads a tokenizer.json. Only WordLevel models are accepted;
// ids must be non-negative and each id must name one text (added tokens may
// repeat vocabulary entries with the same id, as tokenizers writes them).
func ParseTokenizer(data []byte) (*Tokenizer, error) {
	var f tokenizerFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if f.Model.Type != "WordLevel" {
		return nil, fmt.Errorf("tokenizer.json: model.type %q: only WordLevel (character-level) is supported", f.Model.Type)
	}
	if len(f.Model.Vocab) == 0 && len(f.AddedTokens) == 0 {
		return nil, fmt.Errorf("tokenizer.json: empty vocabulary")
	}
	t, err := NewTokenizer(f.Model.Vocab, f.AddedTokens)
	if err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	if f.Model.UnkToken != "" {
		if id, ok := t.vocab[f.Model.UnkToken]; ok {
			t.unk = id
		}
	}
	return t, nil
}

// NewTokenizer builds a tokenizer from a vocabulary and added tokens. The
// id space is 0..max id; gaps are allowed (Token returns "" there). Ids
// must be below MaxVocabSize.
func NewTokenizer(vocab map[string]int32, added []AddedToken) (*Tokenizer, error) {
	t := &Tokenizer{vocab: make(map[string]int32, len(vocab)+len(added)), unk: -1}
	maxID := int32(-1)
	put := func(text string, id int32) error {
		if id < 0 {
			return fmt.Errorf("token %q has negative id %d", text, id)
		}
		if id >= MaxVocabSize { // the id space is allocated densely below
			return fmt.Errorf("token %q has id %d, above the limit %d", text, id, MaxVocabSize-1)
		}
		if text == "" {
			return fmt.Errorf("empty token text for id %d", id)
		}
		if old, ok := t.vocab[text]; ok && old != id {
			return fmt.Errorf("token %q has two ids, %d and %d", text, old, id)
		}
		t.vocab[text] = id
		if id > maxID {
			maxID = id
		}
		return nil
	}
	for text, id := range vocab {
		if err := put(text, id); err != nil {
			return nil, err
		}
	}
	for _, a := range added {
		if err := put(a.Content, a.ID); err != nil {
			return nil, err
		}
	}
	t.tokens = make([]string, maxID+1)
	t.special = make([]bool, maxID+1)
	for text, id := range t.vocab {
		if t.tokens[id] != "" && t.tokens[id] != text {
			return nil, fmt.Errorf("id %d names two tokens, %q and %q", id, t.tokens[id], text)
		}
		t.tokens[id] = text
	}
	for _, a := range added {
		if a.Special {
			t.special[a.ID] = true
		}
		if utf8.RuneCountInString(a.Content) > 1 {
			if t.addedByFirst == nil {
				t.addedByFirst = map[byte][]string{}
			}
			t.addedByFirst[a.Content[0]] = append(t.addedByFirst[a.Content[0]], a.Content)
		}
	}
	for _, list := range t.addedByFirst {
		sort.Slice(list, func(i, j int) bool {
			if len(list[i]) != len(list[j]) {
				return len(list[i]) > len(list[j])
			}
			return list[i] < list[j]
		})
	}
	if id, ok := t.vocab["<unk>"]; ok {
		t.unk = id
	}
	return t, nil
}

// Size is the id space: one more than the largest id.
func (t *Tokenizer) Size() int { return len(t.tokens) }

// ID returns the id of a token text.
func (t *Tokenizer) ID(tok string) (int32, bool) {
	id, ok := t.vocab[tok]
	return id, ok
}

// Token returns the text of an id, or "" for an id outside the vocabulary.
func (t *Tokenizer) Token(id int32) string {
	if id < 0 || int(id) >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// IsSpecial reports whether id is an added token marked special.
func (t *Tokenizer) IsSpecial(id int32) bool {
	return id >= 0 && int(id) < len(t.special) && t.special[id]
}

// Encode turns text into ids, one per character; multi-character added
// tokens written literally in text (e.g. "<bos>") become their single id,
// as in Hugging Face tokenizers. Characters outside the vocabulary are an
// error naming each of them once (there is no silent <unk> mapping: the
// couplet layer must tell the user which character it cannot write).
func (t *Tokenizer) Encode(text string) ([]int32, error) {
	ids := make([]int32, 0, utf8.RuneCountInString(text))
	var unknown []string
	seen := map[string]bool{}
outer:
	for i := 0; i < len(text); {
		for _, a := range t.addedByFirst[text[i]] {
			if strings.HasPrefix(text[i:], a) {
				ids = append(ids, t.vocab[a])
				i += len(a)
				continue outer
			}
		}
		r, n := utf8.DecodeRuneInString(text[i:])
		ch := text[i : i+n]
		if r == utf8.RuneError && n <= 1 {
			ch = fmt.Sprintf("%q", text[i:i+1])
		}
		if id, ok := t.vocab[ch]; ok {
			ids = append(ids, id)
		} else if !seen[ch] {
			seen[ch] = true
			unknown = append(unknown, ch)
		}
		i += n
	}
	if len(unknown) > 0 {
		return nil, &UnknownCharsError{Chars: unknown}
	}
	return ids, nil
}

// UnknownCharsError lists characters that the vocabulary lacks, in order of
// first appearance.
type UnknownCharsError struct{ Chars []string }

func (e *UnknownCharsError) Error() string {
	return fmt.Sprintf("tokenizer: characters not in the vocabulary: %s", strings.Join(e.Chars, " "))
}

// Decode concatenates the texts of ids, skipping special tokens and ids
// outside the vocabulary.
func (t *Tokenizer) Decode(ids []int32) string {
	var b strings.Builder
	for _, id := range ids {
		if t.IsSpecial(id) {
			continue
		}
		b.WriteString(t.Token(id))
	}
	return b.String()
}

// MarshalJSON writes the tokenizer as a Hugging Face tokenizers file
// (WordLevel model, one-character split pre-tokenizer) that
// tokenizers.Tokenizer.from_file can load.
func (t *Tokenizer) MarshalJSON() ([]byte, error) {
	var adds []AddedToken
	for id, s := range t.special {
		if s {
			adds = append(adds, AddedToken{ID: int32(id), Content: t.tokens[id], Special: true})
		}
	}
	unk := "<unk>"
	if t.unk >= 0 {
		unk = t.tokens[t.unk]
	}
	out := map[string]any{
		"version":        "1.0",
		"truncation":     nil,
		"padding":        nil,
		"added_tokens":   adds,
		"normalizer":     nil,
		"pre_tokenizer":  map[string]any{"type": "Split", "pattern": map[string]any{"Regex": "."}, "behavior": "Isolated", "invert": false},
		"post_processor": nil,
		"decoder":        nil,
		"model":          map[string]any{"type": "WordLevel", "vocab": t.vocab, "unk_token": unk},
	}
	return json.Marshal(out)
}
