package cuda

import (
	"syscall"
	"unsafe"
)

// kernelSigaction is the kernel's struct sigaction for rt_sigaction on
// linux/amd64 and linux/arm64.
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

const (
	saOnStack = 0x08000000
	sigDfl    = 0
	sigIgn    = 1
	maxSignal = 64
)

// fixSignalStacks adds SA_ONSTACK to every installed signal handler that
// lacks it and reports how many it changed. The CUDA libraries install
// handlers without it (and chain to Go's); Go's runtime then dies on the
// next such signal ("non-Go code set up signal handler without SA_ONSTACK
// flag"), so a SIGTERM killed the server instead of draining it. Call it
// after every library load.
func fixSignalStacks() int {
	fixed := 0
	for sig := 1; sig <= maxSignal; sig++ {
		if sig == int(syscall.SIGKILL) || sig == int(syscall.SIGSTOP) {
			continue
		}
		var act kernelSigaction
		if rt_sigaction(sig, nil, &act) != 0 || act.handler == sigDfl || act.handler == sigIgn || act.flags&saOnStack != 0 {
			continue
		}
		act.flags |= saOnStack
		if rt_sigaction(sig, &act, nil) == 0 {
			fixed++
		}
	}
	return fixed
}

// rt_sigaction sets (act, if not nil) and reads (old, if not nil) the
// action of sig; it returns the errno (0 on success).
func rt_sigaction(sig int, act, old *kernelSigaction) syscall.Errno {
	_, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(act)), uintptr(unsafe.Pointer(old)), 8, 0, 0)
	return e
}
