package bench

import "syscall"

// childAttr puts the server in its own process group, so a terminal's Ctrl-C
// reaches only the bench (which then stops the server itself after writing
// the partial report), and asks the kernel to SIGTERM it if the bench dies.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
