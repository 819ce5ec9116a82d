package controlplane_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts outside a bubble is gone when it ends
// (synctest checks the bubbles itself). The browser tests' one chromium
// is ended first.
func TestMain(m *testing.M) {
	code := m.Run()
	closeBrowser()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}
