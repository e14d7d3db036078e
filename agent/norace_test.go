//go:build !race

package agent

// raceDetector: this test binary runs without the race detector.
const raceDetector = false
