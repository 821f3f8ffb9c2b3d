//go:build race

package service

// raceEnabled: under the race detector sync.Pool drops a share of what is
// put back, so that a decision's scratch is sometimes made anew: the
// allocation tests through the service count without it.
const raceEnabled = true
