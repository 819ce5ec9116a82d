package boottime_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/internal/boottime"
)

// The alarm fires at the instant of CLOCK_BOOTTIME it was set to, not
// before, and a re-arm replaces the earlier setting.
func TestAlarmFiresAtItsInstant(t *testing.T) {
	a, err := boottime.NewAlarm()
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	at := boottime.Now().Add(time.Hour)
	if err := a.Set(at); err != nil {
		t.Fatal(err)
	}
	at = boottime.Now().Add(80 * time.Millisecond) // moved earlier
	if err := a.Set(at); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.C():
	case <-time.After(5 * time.Second):
		t.Fatal("the alarm did not fire")
	}
	if now := boottime.Now(); now.Before(at) {
		t.Fatalf("fired %v early", at.Sub(now))
	}
	// An instant in the past fires at once.
	if err := a.Set(boottime.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-a.C():
	case <-time.After(5 * time.Second):
		t.Fatal("a past instant did not fire")
	}
}

// Since runs on a bubble's fake time, and FromTime maps a time.Now reading
// onto a clock.
func TestSinceIsFakeTimeInABubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		c := boottime.Since(t0)
		start := c.Now()
		time.Sleep(90 * time.Second)
		if got := c.Now().Sub(start); got != 90*time.Second {
			t.Fatalf("clock advanced %v, want 90s", got)
		}
		if got := boottime.FromTime(c, t0); got != start {
			t.Fatalf("FromTime(t0) = %v, want %v", got, start)
		}
	})
}
