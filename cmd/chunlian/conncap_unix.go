//go:build unix

package main

import "syscall"

// fdReserve is the file descriptors kept out of the connection cap for the
// model files, logs, the listener and the probe reserve's own sockets.
const fdReserve = 128

// maxConnsForFDs returns want (--max-conns, or the server's default),
// lowered below the process's open-file limit when that is short, so that
// a flood of clients cannot exhaust file descriptors (the server's probe
// reserve then still has descriptors to accept).
func maxConnsForFDs(want int) int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return want
	}
	if r.Cur >= uint64(want+fdReserve) {
		return want
	}
	return max(16, int(r.Cur)-fdReserve)
}
