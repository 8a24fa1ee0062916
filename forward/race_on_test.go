//go:build race

package forward

// raceEnabled: the race detector adds allocations of its own.
const raceEnabled = true
