// Package weights embeds the shipped couplet models, so that `chunlian
// serve` works on a fresh machine with no download.
//
// FS holds DefaultDir, in the Hugging Face layout that package model loads
// (model.LoadFS(weights.FS, weights.DefaultDir)):
//
//	config.json             LlamaForCausalLM config (d 384, 8 layers, 6 heads, ffn 1024, vocab 6294, tied embeddings)
//	model.safetensors       bf16 weights (33 MB)
//	tokenizer.json          character-level WordLevel vocabulary + special tokens as added_tokens
//	tokenizer_config.json   for transformers' AutoTokenizer
//	generation_config.json  bos/eos/pad ids
//	chunlian.json           special-token roles and prompt layouts (model.Meta)
//	banner_candidates.txt   4-character idioms suitable as 横批 (MIT, from THUOCL and chinese-xinhua)
//
// and SpringDir, the spring model: the default model fine-tuned on
// spring-festival couplets for the blessing-word modes (docs/DECISIONS.md,
// "The spring model"). It shares every file but the weights with
// DefaultDir, and its weights are stored as their difference from the
// default model's (model.safetensors.xor, see DecodeSpring): 19 MB against
// 33 MB for every clone. SpringFS presents it as a whole model directory.
//
// The files are produced by training/ (see training/README.md for the
// recipe, the data and their licenses).
// They are read-only data; nothing here changes at run time.
package weights

import (
	"bytes"
	"compress/zlib"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"time"
)

// DefaultDir is the name of the embedded model directory inside FS.
const DefaultDir = "chunlian-base"

// SpringDir is the name of the spring model's directory in SpringFS.
const SpringDir = "chunlian-spring"

// FS is the embedded model directory tree (DefaultDir and SpringDir and
// their files).
//
//go:embed chunlian-base chunlian-spring
var FS embed.FS

// SpringFS is a model directory SpringDir: its model.safetensors is
// DecodeSpring's, every other file DefaultDir's.
var SpringFS fs.FS = springFS{}

// springFS implements fs.ReadFileFS, which fs.ReadFile (and so
// model.LoadFS) uses; Open serves the same bytes.
type springFS struct{}

func (f springFS) Open(name string) (fs.File, error) {
	if name != SpringDir+"/model.safetensors" {
		return FS.Open(f.under(name))
	}
	b, err := f.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return &memFile{Reader: bytes.NewReader(b), name: path.Base(name), size: int64(len(b))}, nil
}

func (f springFS) ReadFile(name string) ([]byte, error) {
	if name != SpringDir+"/model.safetensors" {
		return fs.ReadFile(FS, f.under(name))
	}
	base, err := fs.ReadFile(FS, DefaultDir+"/model.safetensors")
	if err != nil {
		return nil, err
	}
	delta, err := fs.ReadFile(FS, SpringDir+"/model.safetensors.xor")
	if err != nil {
		return nil, err
	}
	b, err := DecodeSpring(base, delta)
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: name, Err: err}
	}
	return b, nil
}

// under maps SpringDir's shared files to DefaultDir's.
func (springFS) under(name string) string {
	if rest, ok := strings.CutPrefix(name, SpringDir+"/"); ok {
		return path.Join(DefaultDir, rest)
	}
	return name
}

// EncodeSpring is the stored form of a model file spring that has base's
// size (the same tensors, bf16): x = spring XOR base, byte by byte, its
// odd bytes and then its even bytes, zlib-compressed. The odd bytes of a
// little-endian bf16 hold sign and exponent, which a fine-tune rarely
// changes (78 % of them are 0 in x), so they compress well.
func EncodeSpring(base, spring []byte) ([]byte, error) {
	if len(base) != len(spring) || len(base)%2 != 0 {
		return nil, fmt.Errorf("weights: spring model of %d bytes against %d: want the same even size", len(spring), len(base))
	}
	h := len(base) / 2
	planes := make([]byte, len(base)) // [odd bytes of x | even bytes of x]
	for i := range h {
		planes[i] = base[2*i+1] ^ spring[2*i+1]
		planes[h+i] = base[2*i] ^ spring[2*i]
	}
	var out bytes.Buffer
	zw, err := zlib.NewWriterLevel(&out, zlib.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(planes); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// DecodeSpring inverts EncodeSpring: the spring model's file from base's
// and the stored delta. The delta must expand to exactly len(base) bytes.
// It streams the delta's planes through a small buffer straight into the
// result, so decoding holds one file's worth of memory besides its inputs.
func DecodeSpring(base, delta []byte) ([]byte, error) {
	if len(base)%2 != 0 {
		return nil, fmt.Errorf("weights: base model file of odd size %d", len(base))
	}
	zr, err := zlib.NewReader(bytes.NewReader(delta))
	if err != nil {
		return nil, fmt.Errorf("weights: spring delta: %w", err)
	}
	h := len(base) / 2
	out := make([]byte, len(base))
	buf := make([]byte, 64<<10)
	for _, parity := range []int{1, 0} { // the odd bytes' plane, then the even bytes'
		for i := 0; i < h; {
			n, err := io.ReadFull(zr, buf[:min(len(buf), h-i)])
			if err != nil {
				return nil, fmt.Errorf("weights: spring delta shorter than the %d-byte base: %w", len(base), err)
			}
			for j, x := range buf[:n] {
				k := 2*(i+j) + parity
				out[k] = base[k] ^ x
			}
			i += n
		}
	}
	if n, _ := zr.Read(buf[:1]); n != 0 {
		return nil, fmt.Errorf("weights: spring delta longer than the %d-byte base", len(base))
	}
	if err := zr.Close(); err != nil { // the Adler-32 check's result, from that last read
		return nil, fmt.Errorf("weights: spring delta: %w", err)
	}
	return out, nil
}

// memFile is an fs.File over bytes in memory.
type memFile struct {
	*bytes.Reader
	name string
	size int64
}

func (f *memFile) Stat() (fs.FileInfo, error) { return f, nil }
func (f *memFile) Close() error               { return nil }
func (f *memFile) Name() string               { return f.name }
func (f *memFile) Size() int64                { return f.size }
func (f *memFile) Mode() fs.FileMode          { return 0o444 }
func (f *memFile) ModTime() time.Time         { return time.Time{} }
func (f *memFile) IsDir() bool                { return false }
func (f *memFile) Sys() any                   { return nil }
