//go:build !unix

package model

import "os"

// mapFile reads the file (no mmap on this platform); release is a no-op.
func mapFile(name string) (data []byte, release func() error, err error) {
	data, err = os.ReadFile(name)
	return data, func() error { return nil }, err
}
