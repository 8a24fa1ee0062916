package cuda

import (
	"fmt"
	"unsafe"
)

// CUDA graphs for forward steps.
//
// A step of a small model is dominated by launch overhead (about 68 kernel
// and GEMM launches for 8 layers, each a few µs of CPU and GPU time). No
// kernel depends on the batch's composition except through the metadata
// (positions, slots, sequence index and block tables are read on the
// device), so any batch of T ≤ maxGraphTokens tokens — decode, prefill or
// mixed — is padded to a bucket size Tp (logits rows too) and run as a
// captured graph keyed by (Tp, block-table stride): the metadata is copied
// to the same device buffer before each replay, so one graph serves every
// batch of that shape. Padding tokens use token 0 at position 0, a dummy sequence whose
// block table is the reserved block numBlocks (allocated beyond the
// blocks the engine sees), and logits row 0; their results are ignored.
// Graphs are destroyed whenever a buffer they reference is reallocated.

// graphKey identifies a captured decode graph.
type graphKey struct{ tp, stride int }

// maxGraphTokens is the largest batch run as a graph.
const maxGraphTokens = 8192

// graphBucket returns the padded size for a batch of T tokens, or 0 when T
// is too large for graphs. Buckets: 1, 2, 4, 8, then multiples of 16 up to
// 256, of 128 up to 2048, then of 512; with fine (Options.FineGraphBuckets)
// multiples of 16 up to 1024, of 64 up to 4096, then of 256: at most 15,
// 63 or 255 padding tokens instead of 127 or 511, for three times as many
// graphs.
func graphBucket(T int, fine bool) int {
	round := func(n int) int { return (T + n - 1) / n * n }
	switch {
	case T < 1 || T > maxGraphTokens:
		return 0
	case T <= 8:
		p := 1
		for p < T {
			p *= 2
		}
		return p
	case fine && T <= 1024, T <= 256:
		return round(16)
	case fine && T <= 4096:
		return round(64)
	case fine:
		return round(256)
	case T <= 2048:
		return round(128)
	default:
		return round(512)
	}
}

// padMeta repacks the prepared metadata (offsets off, T tokens, R rows, S
// sequences) for tp ≥ T tokens and tp rows, adding the dummy sequence S.
// Layout as in prepare: tokens | positions | slots | tokSeq | rows | tables.
func (b *Backend) padMeta(off [6]int, T, R, S, stride, tp int) ([]int32, [6]int) {
	var po [6]int
	for i := range 6 {
		po[i] = i * tp
	}
	n := 5*tp + (S+1)*stride
	if cap(b.padBuf) < n {
		b.padBuf = make([]int32, n, n+n/2)
	}
	p := b.padBuf[:n]
	h := b.hostMeta
	dummySlot := int32(b.numBlocks * b.opt.BlockSize)
	fill := func(dst []int32, src []int32, pad int32) {
		copy(dst, src)
		for i := len(src); i < len(dst); i++ {
			dst[i] = pad
		}
	}
	fill(p[po[0]:po[1]], h[off[0]:off[0]+T], 0)
	fill(p[po[1]:po[2]], h[off[1]:off[1]+T], 0)
	fill(p[po[2]:po[3]], h[off[2]:off[2]+T], dummySlot)
	fill(p[po[3]:po[4]], h[off[3]:off[3]+T], int32(S))
	fill(p[po[4]:po[5]], h[off[4]:off[4]+R], 0)
	copy(p[po[5]:], h[off[5]:off[5]+S*stride])
	dummy := p[po[5]+S*stride : po[5]+(S+1)*stride]
	for i := range dummy {
		dummy[i] = int32(b.numBlocks)
	}
	return p, po
}

// launchGraph replays (capturing first if needed) the graph for
// (tp, stride). If capture fails, graphs are switched off for this
// Backend and the step runs eagerly; the error is kept for GraphStats.
func (b *Backend) launchGraph(tp, stride int, off [6]int) error {
	d := &b.l.drv
	k := graphKey{tp, stride}
	exec, ok := b.graphs[k]
	if !ok {
		var err error
		exec, err = b.capture(tp, stride, off)
		if err != nil {
			b.graphErr = err
			b.graphsOn = false
			b.dropGraphs()
			b.eagerSteps++
			return b.enqueue(tp, tp, stride, off)
		}
		b.graphs[k] = exec
		b.captures++
	}
	b.graphLaunches++
	return d.call("cuGraphLaunch", d.cuGraphLaunch, exec, b.stream)
}

// Stream capture modes (cuda.h CUstreamCaptureMode).
const captureModeThreadLocal = 1

func (b *Backend) capture(tp, stride int, off [6]int) (uintptr, error) {
	d := &b.l.drv
	if err := d.call("cuStreamBeginCapture", d.cuStreamBeginCapture, b.stream, captureModeThreadLocal); err != nil {
		return 0, err
	}
	lerr := b.enqueue(tp, tp, stride, off)
	var g uintptr
	eerr := d.call("cuStreamEndCapture", d.cuStreamEndCapture, b.stream, uintptr(unsafe.Pointer(&g)))
	if lerr != nil || eerr != nil {
		if g != 0 {
			_ = d.call("cuGraphDestroy", d.cuGraphDestroy, g)
		}
		return 0, fmt.Errorf("cuda: capturing graph (T=%d): launch: %v; end: %v", tp, lerr, eerr)
	}
	var exec uintptr
	err := d.call("cuGraphInstantiateWithFlags", d.cuGraphInstantiate, uintptr(unsafe.Pointer(&exec)), g, 0)
	_ = d.call("cuGraphDestroy", d.cuGraphDestroy, g)
	if err != nil {
		return 0, err
	}
	return exec, nil
}

// dropGraphs destroys every captured graph (their buffers are changing).
func (b *Backend) dropGraphs() {
	d := &b.l.drv
	for k, exec := range b.graphs {
		_ = d.call("cuGraphExecDestroy", d.cuGraphExecDestroy, exec)
		delete(b.graphs, k)
	}
}

// GraphStats says how steps ran: replays of captured graphs,
// captures, eager (non-graph) steps, and why graphs were switched off (nil
// if they were not).
type GraphStats struct {
	Launches, Captures, Eager int64
	Err                       error
}

// GraphStats returns the counters (read on the worker).
func (b *Backend) GraphStats() GraphStats {
	var s GraphStats
	if b.lockOpen() != nil {
		return s
	}
	defer b.mu.Unlock()
	_ = b.do(func() error {
		s = GraphStats{b.graphLaunches, b.captures, b.eagerSteps, b.graphErr}
		return nil
	})
	return s
}
