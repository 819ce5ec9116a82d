package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// A conversation's limits are stored with it, read back
// by Get and List, and carried in the turn of every claim of it, by a
// single claim and a batched one; a conversation without limits carries
// none. Limits the store cannot accept write nothing: a negative or absurd
// figure is ErrInvalid, disk_bytes and limits of a process conversation
// are wire.ErrLimitUnsupported.
func testLimitsStored(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	lim := wire.Limits{CPUs: 1.5, MemoryBytes: 256 << 20, Pids: 64}
	limited := f.routed(wire.CreateConversationRequest{Limits: lim})
	plain := f.routed(wire.CreateConversationRequest{})
	if limited.Limits != lim {
		t.Fatalf("CreateConversation answered limits %+v, want %+v", limited.Limits, lim)
	}
	if got := f.conv(limited.ID).Limits; got != lim {
		t.Fatalf("GetConversation limits = %+v, want %+v", got, lim)
	}
	if got := f.conv(plain.ID).Limits; !got.IsZero() {
		t.Fatalf("a conversation without limits reads %+v", got)
	}
	list, err := st.ListConversations(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range list {
		if want := map[string]wire.Limits{limited.ID: lim}[c.ID]; c.Limits != want {
			t.Fatalf("ListConversations: %s limits %+v, want %+v", c.ID, c.Limits, want)
		}
	}

	f.enqueue(limited.ID, "one")
	c := f.claim(at(time.Second))
	if c.Turn.ConversationID != limited.ID || c.Turn.Limits != lim {
		t.Fatalf("claimed turn of %s with limits %+v, want %s with %+v", c.Turn.ConversationID, c.Turn.Limits, limited.ID, lim)
	}
	other := f.newHost("host-batch")
	second := f.routed(wire.CreateConversationRequest{Limits: wire.Limits{MemoryBytes: 64 << 20}})
	f.enqueue(plain.ID, "p")
	f.enqueue(second.ID, "s")
	got := map[string]wire.Limits{}
	for _, c := range f.claimBatch(other, 4, "", at(2*time.Second)) {
		got[c.Turn.ConversationID] = c.Turn.Limits
	}
	if want := (map[string]wire.Limits{plain.ID: {}, second.ID: {MemoryBytes: 64 << 20}}); len(got) != 2 || got[plain.ID] != want[plain.ID] || got[second.ID] != want[second.ID] {
		t.Fatalf("a batched claim's turns carry limits %+v, want %+v", got, want)
	}

	before, err := st.ListConversations(f.ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  wire.CreateConversationRequest
		want error
	}{
		{"negative memory", wire.CreateConversationRequest{Limits: wire.Limits{MemoryBytes: -1}}, store.ErrInvalid},
		{"negative pids", wire.CreateConversationRequest{Limits: wire.Limits{Pids: -5}}, store.ErrInvalid},
		{"negative cpus", wire.CreateConversationRequest{Limits: wire.Limits{CPUs: -0.5}}, store.ErrInvalid},
		{"cpus over the bound", wire.CreateConversationRequest{Limits: wire.Limits{CPUs: wire.MaxLimitCPUs + 1}}, store.ErrInvalid},
		{"memory under the engine's minimum", wire.CreateConversationRequest{Limits: wire.Limits{MemoryBytes: 1 << 20}}, store.ErrInvalid},
		{"memory over the bound", wire.CreateConversationRequest{Limits: wire.Limits{MemoryBytes: wire.MaxLimitMemoryBytes + 1}}, store.ErrInvalid},
		{"pids over the bound", wire.CreateConversationRequest{Limits: wire.Limits{Pids: wire.MaxLimitPids + 1}}, store.ErrInvalid},
		{"disk_bytes", wire.CreateConversationRequest{Limits: wire.Limits{DiskBytes: 1 << 30}}, wire.ErrLimitUnsupported},
		{"limits of a process conversation", wire.CreateConversationRequest{Sandbox: wire.SandboxProcess, Limits: wire.Limits{Pids: 10}}, wire.ErrLimitUnsupported},
		{"limits required of process hosts", wire.CreateConversationRequest{Requires: wire.Labels{wire.LabelSandbox: wire.SandboxProcess}, Limits: wire.Limits{Pids: 10}}, wire.ErrLimitUnsupported},
	} {
		tc.req.Image, tc.req.AgentCommand = "img:1", []string{"agent"}
		_, err := st.CreateConversation(f.ctx, tc.req, T0)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: CreateConversation = %v, want %v", tc.name, err, tc.want)
		}
		if tc.want == wire.ErrLimitUnsupported && errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v is also ErrInvalid (answered 400 invalid, not unsupported)", tc.name, err)
		}
	}
	after, err := st.ListConversations(f.ctx)
	if err != nil || len(after) != len(before) {
		t.Fatalf("refused creations left %d conversations (%v), want %d", len(after), err, len(before))
	}
}
