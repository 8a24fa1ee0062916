package cuda

import (
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// The CUDA wrappers (driverFns.call, sc) take the C arguments as
// uintptrs, and callers pass out-parameters as uintptr(unsafe.Pointer(&x))
// with x a local. A uintptr is not a pointer to the garbage collector: if
// x stays on the goroutine stack and the stack grows (is copied) between
// that conversion and the C call, C writes x's old address and x keeps
// its zero value. purego.SyscallN is declared //go:uintptrescapes so that
// such x are moved to the heap, but that only covers conversions written
// in a call to SyscallN itself; a wrapper must carry the directive too.
// Without it, cuMemAlloc's device pointer can be lost in regrow: draw_rows
// then writes through a nil drawOut and the copy of the draws fails with
// CUDA_ERROR_INVALID_VALUE.
//
// The tests call libc's memset through each wrapper from many stack
// depths, each in a fresh goroutine (small stack), so that some call
// lands where the wrapper's frame needs a bigger stack. Every write must
// reach the local.

const fill = 0x5a

// libcMemset returns memset's address, or skips when libc cannot be
// opened (not a glibc system).
func libcMemset(t *testing.T) uintptr {
	t.Helper()
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Skipf("libc.so.6 not loadable: %v", err)
	}
	fn, err := purego.Dlsym(h, "memset")
	if err != nil {
		t.Skipf("memset: %v", err)
	}
	return fn
}

// deep recurses depth frames (pad keeps each frame some bytes big) and then
// runs f, so that f starts at a different stack offset for each depth.
//
//go:noinline
func deep(depth int, f func() bool) bool {
	var pad [8]uintptr
	if depth > 0 {
		pad[depth%8] = uintptr(depth)
		return deep(depth-1, f) && pad[depth%8] == uintptr(depth)
	}
	return f()
}

//go:noinline
func memsetViaCall(fn uintptr) bool {
	var x uint64
	var f driverFns
	_ = f.call("memset", fn, uintptr(unsafe.Pointer(&x)), fill, 8)
	return x == 0x5a5a5a5a5a5a5a5a
}

//go:noinline
func memsetViaSc(fn uintptr) bool {
	var x uint64
	_ = sc(fn, uintptr(unsafe.Pointer(&x)), fill, 8)
	return x == 0x5a5a5a5a5a5a5a5a
}

func TestWrappersKeepOutParamsOffTheStack(t *testing.T) {
	fn := libcMemset(t)
	for _, tc := range []struct {
		name string
		run  func(uintptr) bool
	}{
		{"driverFns.call", memsetViaCall},
		{"sc", memsetViaSc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lost := 0
			for depth := 0; depth < 400; depth++ {
				done := make(chan bool)
				go func() { done <- deep(depth, func() bool { return tc.run(fn) }) }()
				if !<-done {
					lost++
				}
			}
			if lost > 0 {
				t.Errorf("%d of 400 writes through %s missed the local (its stack moved during the call)", lost, tc.name)
			}
		})
	}
}
