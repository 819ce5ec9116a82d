package controlplane_test

import (
	"testing"

	"go.uber.org/goleak"
)

// Every goroutine a test starts outside a bubble is gone when it ends
// (synctest checks the bubbles itself).
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
