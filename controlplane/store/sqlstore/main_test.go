package sqlstore

import (
	"testing"

	"go.uber.org/goleak"
)

// Every store is closed when its test ends; nothing may keep running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
