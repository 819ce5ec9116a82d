package main

import (
	"os"
	"testing"
)

// TestMain makes the test binary the runnerd its daemons start: the
// daemons that tests run in-process (runDaemon) start their turn children
// and spare from their own executable, this binary, with `turn` or
// `supervise`, which must then be those roles and not another run of the
// tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "turn" || os.Args[1] == "supervise") {
		main()
	}
	os.Exit(m.Run())
}
