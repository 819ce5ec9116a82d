package runner

import (
	"testing"
	"time"
)

// Polls and backoffs vary within ±frac and are not all the same.
func TestJitterStaysInBoundsAndVaries(t *testing.T) {
	const d = 10 * time.Second
	seen := map[time.Duration]bool{}
	for range 1000 {
		j := jitter(d, 0.2)
		if j < 8*time.Second || j > 12*time.Second {
			t.Fatalf("jitter(%v, 0.2) = %v", d, j)
		}
		seen[j] = true
		s := spread(d)
		if s < 0 || s >= d {
			t.Fatalf("spread(%v) = %v", d, s)
		}
	}
	if len(seen) < 100 {
		t.Fatalf("only %d distinct values in 1000", len(seen))
	}
	if jitter(d, 0) != d || jitter(0, 0.2) != 0 || spread(0) != 0 {
		t.Fatal("zero cases")
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:secret@cp.example:8443/base?token=x#f": "https://cp.example:8443/base",
		"http://127.0.0.1:8080":                              "http://127.0.0.1:8080",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}
