//go:build race

package agent

// raceDetector: this test binary runs under the race detector, which
// makes every goroutine several times slower.
const raceDetector = true
