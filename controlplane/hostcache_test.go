package controlplane_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/wire"
)

// A host token the store accepted is answered from the replica's memory
// for at most controlplane.HostTokenCache: a host removed through one
// replica is refused there at once, and through another replica within
// the bound; meanwhile the other replica hands the removed host no turn
// (the claim statement reads the host's row).
func TestHostTokenCacheRevocationBound(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := controlplane.New(controlplane.Config{
		Store: f.st, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: f.clock.Now,
	})
	hs := httptest.NewServer(other.Handler())
	t.Cleanup(hs.Close)
	b := &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
	conv := f.newConversation()
	states := func(c *wire.Client) error {
		_, err := c.ConversationStates(ctx, f.hostToken, wire.ConversationStatesRequest{ConversationIDs: []string{conv.ID}})
		return err
	}
	for _, c := range []*wire.Client{f.wc, b} {
		if err := states(c); err != nil {
			t.Fatalf("before the removal: %v", err)
		}
	}
	f.send(conv.ID, "a turn the removed host must not get")

	f.expect(http.MethodPost, strings.ReplaceAll(controlplane.PathAdminHost, "{name}", "host-a")+"remove", userToken, `{"reason":"test"}`, http.StatusNoContent, "")
	if st, _ := statusOf(states(f.wc)); st != http.StatusUnauthorized {
		t.Fatalf("the replica that removed the host answered its token with %d, want 401 at once", st)
	}
	if err := states(b); err != nil {
		t.Fatalf("another replica within the bound: %v; want its cached answer (else this test proves no cache)", err)
	}
	if c, err := b.Claim(ctx, f.hostToken, wire.ClaimRequest{}); !errors.Is(err, wire.ErrNoClaim) {
		t.Fatalf("a removed host claimed through another replica within the bound: %+v, %v; want no turn", c, err)
	}
	f.clock.Advance(controlplane.HostTokenCache)
	if st, _ := statusOf(states(b)); st != http.StatusUnauthorized {
		t.Fatalf("another replica past the bound answered the removed host's token with %d, want 401", st)
	}
}
