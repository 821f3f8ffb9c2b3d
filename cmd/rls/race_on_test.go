//go:build race

package main

// raceEnabled: the race detector makes every request cost several times
// the CPU, which tests that saturate the machine take into account.
const raceEnabled = true
