package supervisor

import (
	"context"
	"testing"
)

// BenchmarkTurn is one whole turn through a running supervisor: activate,
// run the demo agent (start, prompt, two events, exit), drain, settle.
func BenchmarkTurn(b *testing.B) {
	s := startServe(b)
	ctx := context.Background()
	for b.Loop() {
		act, err := s.c.Activate(ctx, 0)
		if err != nil {
			b.Fatal(err)
		}
		turn, err := s.c.Run(ctx, act.ID, []string{demoAgent}, "bench")
		if err != nil {
			b.Fatal(err)
		}
		for {
			if _, err := turn.Next(); err != nil {
				break
			}
		}
		turn.Close()
		if _, err := s.c.Settle(ctx, act.ID); err != nil {
			b.Fatal(err)
		}
	}
}
