//go:build unix

package model

import (
	"os"
	"syscall"
)

// mapFile maps a file read-only. release unmaps it; the bytes must not be
// used afterwards. An empty file gives an empty slice.
func mapFile(name string) (data []byte, release func() error, err error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	if st.Size() == 0 {
		return nil, func() error { return nil }, nil
	}
	data, err = syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		// Some file systems cannot map; reading works everywhere.
		data, err = os.ReadFile(name)
		return data, func() error { return nil }, err
	}
	return data, func() error { return syscall.Munmap(data) }, nil
}
