//go:build !unix

package main

// maxConnsForFDs: no open-file limit to respect on this platform; 0 means
// the server's default.
func maxConnsForFDs(serverDefault int) int { return 0 }
