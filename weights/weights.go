// Package weights embeds the shipped default couplet model, so that
// `chunlian serve` works on a fresh machine with no download.
//
// FS holds one directory, DefaultDir, in the Hugging Face layout that
// package model loads (model.LoadFS(weights.FS, weights.DefaultDir)):
//
//	config.json             LlamaForCausalLM config (d 384, 8 layers, 6 heads, ffn 1024, vocab 6294, tied embeddings)
//	model.safetensors       bf16 weights (33 MB)
//	tokenizer.json          character-level WordLevel vocabulary + special tokens as added_tokens
//	tokenizer_config.json   for transformers' AutoTokenizer
//	generation_config.json  bos/eos/pad ids
//	chunlian.json           special-token roles and prompt layouts (model.Meta)
//	banner_candidates.txt   4-character idioms suitable as 横批 (MIT, from THUOCL and chinese-xinhua)
//
// The files are produced by training/ (see training/README.md for the
// recipe, the data and their licenses).
// They are read-only data; nothing here changes at run time.
package weights

import "embed"

// DefaultDir is the name of the embedded model directory inside FS.
const DefaultDir = "chunlian-base"

// FS is the embedded model directory tree (DefaultDir and its files).
//
//go:embed chunlian-base
var FS embed.FS
