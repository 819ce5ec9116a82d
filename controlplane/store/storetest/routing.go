package storetest

import (
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// beat records a host heartbeat with labels, every five seconds' host.
func (f *fixture) beat(h store.Host, labels wire.Labels, now time.Time) {
	f.t.Helper()
	if err := f.st.RecordHostHeartbeat(f.ctx, h.ID, wire.HostHeartbeat{Capacity: 1, IntervalMS: 5000, Labels: labels}, now); err != nil {
		f.t.Fatalf("RecordHostHeartbeat(%s): %v", h.Name, err)
	}
}

func (f *fixture) routed(req wire.CreateConversationRequest) wire.Conversation {
	f.t.Helper()
	req.Image, req.AgentCommand = "img:1", []string{"agent"}
	c, err := f.st.CreateConversation(f.ctx, req, T0)
	if err != nil {
		f.t.Fatalf("CreateConversation(%+v): %v", req, err)
	}
	return c
}

// Routing. A claim takes only turns whose conversation's
// requirements the host's labels meet, the oldest of those: a Docker
// conversation never goes to a process-sandbox host, nor a process one to
// a Docker host, and a conversation with no requirement goes anywhere. A
// requirement set that no online host meets shows on its queued job as
// unroutable, with the labels the closest host lacks, until a host that
// meets it heartbeats; then that host claims it.
func testRoutingClaimsMeetRequirements(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	proc, dock := f.host, f.newHost("host-docker")
	f.beat(proc, wire.Labels{"sandbox": "process", "os": "linux", "arch": "amd64"}, T0)
	f.beat(dock, wire.Labels{"sandbox": "docker", "os": "linux", "arch": "amd64", "gpu": "a100"}, T0)

	docker := f.routed(wire.CreateConversationRequest{Sandbox: wire.SandboxDocker})
	if want := (wire.Labels{"sandbox": "docker"}); !reflect.DeepEqual(f.conv(docker.ID).Requires, want) {
		t.Fatalf("Requires of a docker conversation = %v, want %v", f.conv(docker.ID).Requires, want)
	}
	gpu := f.routed(wire.CreateConversationRequest{Sandbox: wire.SandboxDocker, Requires: wire.Labels{"gpu": "a100"}})
	zone := f.routed(wire.CreateConversationRequest{Sandbox: wire.SandboxDocker, Requires: wire.Labels{"zone": "eu-1"}})
	process := f.routed(wire.CreateConversationRequest{Sandbox: wire.SandboxProcess})
	anyHost := f.routed(wire.CreateConversationRequest{})
	jDocker, jGPU, jZone := f.enqueue(docker.ID, "d"), f.enqueue(gpu.ID, "g"), f.enqueue(zone.ID, "z")
	jProcess, jAny := f.enqueue(process.ID, "p"), f.enqueue(anyHost.ID, "a")

	// The process host passes the older Docker turns.
	f.claimOn(proc, at(time.Second), jProcess.ID)
	f.claimOn(proc, at(time.Second), jAny.ID)
	f.claimOn(proc, at(time.Second), "")
	f.claimOn(dock, at(time.Second), jDocker.ID)
	f.claimOn(dock, at(time.Second), jGPU.ID)
	f.claimOn(dock, at(time.Second), "")

	// The sweep marks the one requirement set no online host meets.
	n, err := st.SweepRoutes(f.ctx, at(2*time.Second))
	if err != nil || n != 1 {
		t.Fatalf("SweepRoutes = %d, %v; want 1 unroutable", n, err)
	}
	u := f.job(jZone.ID).Unroutable
	if u == nil || !reflect.DeepEqual(u.Missing, []string{"zone=eu-1"}) || !u.Since.Equal(at(2*time.Second)) {
		t.Fatalf("Unroutable of the zone turn = %+v; want missing zone=eu-1 since 2s", u)
	}
	if n, err := st.SweepRoutes(f.ctx, at(3*time.Second)); err != nil || n != 1 || !f.job(jZone.ID).Unroutable.Since.Equal(at(2*time.Second)) {
		t.Fatalf("a second sweep = %d, %v, %+v; want the first time kept", n, err, f.job(jZone.ID).Unroutable)
	}
	if j := f.job(jZone.ID); j.State != wire.JobQueued {
		t.Fatalf("an unroutable turn is %s, want queued", j.State)
	}
	list, err := st.ListJobs(f.ctx, store.JobFilter{State: wire.JobQueued})
	listed := list.Jobs
	if err != nil || len(listed) != 1 || listed[0].Unroutable == nil {
		t.Fatalf("ListJobs(queued) = %+v, %v; want the zone turn, unroutable", listed, err)
	}

	// A host that meets it appears: the next sweep clears it, the host claims it.
	eu := f.newHost("host-eu")
	f.beat(eu, wire.Labels{"sandbox": "docker", "zone": "eu-1"}, at(4*time.Second))
	if n, err := st.SweepRoutes(f.ctx, at(4*time.Second)); err != nil || n != 0 || f.job(jZone.ID).Unroutable != nil {
		t.Fatalf("sweep after a matching host = %d, %v, %+v; want routable", n, err, f.job(jZone.ID).Unroutable)
	}
	f.claimOn(dock, at(5*time.Second), "")
	f.claimOn(eu, at(5*time.Second), jZone.ID)

	// Labels change with the heartbeat: the process host turned Docker.
	f.beat(proc, wire.Labels{"sandbox": "docker"}, at(6*time.Second))
	servers, err := st.ListServers(f.ctx)
	if err != nil || len(servers) != 3 || !reflect.DeepEqual(servers[0].Labels, wire.Labels{"sandbox": "docker"}) ||
		!reflect.DeepEqual(servers[1].Labels, wire.Labels{"arch": "amd64", "gpu": "a100", "os": "linux", "sandbox": "docker"}) {
		t.Fatalf("ListServers labels = %+v, %v", servers, err)
	}
	f.claimOn(proc, at(7*time.Second), f.enqueue(f.routed(wire.CreateConversationRequest{Sandbox: wire.SandboxDocker}).ID, "d2").ID)

	// With no host online, a queued turn says so, with nothing missing.
	quiet := f.enqueue(f.routed(wire.CreateConversationRequest{}).ID, "q")
	if _, err := st.SweepRoutes(f.ctx, at(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if u := f.job(quiet.ID).Unroutable; u == nil || len(u.Missing) != 0 {
		t.Fatalf("Unroutable with every host offline = %+v; want set, nothing missing", u)
	}
}

// Requirements and labels are checked: a key or value that routing could
// not keep, too many, an unknown sandbox, or a sandbox that contradicts
// the requirements is ErrInvalid, and nothing is stored.
func testRoutingInvalidLabels(t *testing.T, st store.Store) {
	f := newFixture(t, st)
	many := wire.Labels{}
	for i := range wire.MaxLabels + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	for _, tc := range []struct {
		name string
		req  wire.CreateConversationRequest
	}{
		{"unknown sandbox", wire.CreateConversationRequest{Sandbox: "vm"}},
		{"sandbox disagrees", wire.CreateConversationRequest{Sandbox: wire.SandboxDocker, Requires: wire.Labels{"sandbox": "process"}}},
		{"upper-case key", wire.CreateConversationRequest{Requires: wire.Labels{"GPU": "a"}}},
		{"comma in a value", wire.CreateConversationRequest{Requires: wire.Labels{"gpu": "a,b"}}},
		{"equals in a key", wire.CreateConversationRequest{Requires: wire.Labels{"a=b": "c"}}},
		{"empty value", wire.CreateConversationRequest{Requires: wire.Labels{"gpu": ""}}},
		{"long value", wire.CreateConversationRequest{Requires: wire.Labels{"gpu": string(make([]byte, wire.MaxLabelBytes+1))}}},
		{"too many", wire.CreateConversationRequest{Requires: many}},
	} {
		tc.req.Image, tc.req.AgentCommand = "i", []string{"a"}
		if _, err := st.CreateConversation(f.ctx, tc.req, T0); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: CreateConversation = %v, want ErrInvalid", tc.name, err)
		}
	}
	if convs, err := st.ListConversations(f.ctx); err != nil || len(convs) != 0 {
		t.Fatalf("conversations after refusals = %d, %v", len(convs), err)
	}
	err := st.RecordHostHeartbeat(f.ctx, f.host.ID, wire.HostHeartbeat{Labels: wire.Labels{"bad key": "x"}}, T0)
	wantErr(t, "a heartbeat with a bad label", err, store.ErrInvalid)
}
