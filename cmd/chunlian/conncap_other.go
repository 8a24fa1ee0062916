//go:build !unix

package main

// maxConnsForFDs: no open-file limit to respect on this platform.
func maxConnsForFDs(want int) int { return want }
