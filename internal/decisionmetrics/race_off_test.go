//go:build !race

package decisionmetrics

// raceEnabled: see race_on_test.go.
const raceEnabled = false
