//go:build unix

package main

import "syscall"

// fdReserve is the file descriptors kept out of the connection cap for the
// model files, logs, the listener and the probe reserve's own sockets.
const fdReserve = 128

// maxConnsForFDs caps client connections below the process's open-file
// limit, so that a flood of clients cannot exhaust file descriptors (the
// server's probe reserve then still has descriptors to accept). 0 means
// "the server's default" (no limit known or it is high enough).
func maxConnsForFDs(serverDefault int) int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0
	}
	if r.Cur >= uint64(serverDefault+fdReserve) {
		return 0
	}
	return max(16, int(r.Cur)-fdReserve)
}
