//go:build !unix

package sampler

import "time"

// cpuTime is unknown here; the cpu-ns metrics then read 0.
func cpuTime() time.Duration { return 0 }
