package cuda

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// A handler installed without SA_ONSTACK (as the CUDA libraries install
// theirs) gets the flag back.
func TestFixSignalStacks(t *testing.T) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGUSR2) // Go's handler, with SA_ONSTACK
	defer signal.Reset(syscall.SIGUSR2)
	var act kernelSigaction
	if e := rt_sigaction(int(syscall.SIGUSR2), nil, &act); e != 0 {
		t.Fatalf("rt_sigaction: %v", e)
	}
	if act.handler == sigDfl || act.flags&saOnStack == 0 {
		t.Fatalf("Go's SIGUSR2 handler: %#x flags %#x, want one with SA_ONSTACK", act.handler, act.flags)
	}
	act.flags &^= saOnStack // what a C library's sigaction would leave
	if e := rt_sigaction(int(syscall.SIGUSR2), &act, nil); e != 0 {
		t.Fatalf("rt_sigaction: %v", e)
	}
	if n := fixSignalStacks(); n < 1 {
		t.Fatalf("fixSignalStacks fixed %d handlers, want at least SIGUSR2's", n)
	}
	var got kernelSigaction
	rt_sigaction(int(syscall.SIGUSR2), nil, &got)
	if got.flags&saOnStack == 0 || got.handler != act.handler {
		t.Fatalf("after the fix: handler %#x flags %#x, want %#x with SA_ONSTACK", got.handler, got.flags, act.handler)
	}
	if n := fixSignalStacks(); n != 0 {
		t.Fatalf("a second fixSignalStacks changed %d handlers, want 0", n)
	}
}
