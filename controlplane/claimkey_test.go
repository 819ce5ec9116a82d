package controlplane_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane"
	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// dropFirstAnswer lets the first 200 answer to a claim be committed by the
// real server and then lost on the way: the connection is reset before a
// byte of it is sent (a timeout, a reset, a drain after the commit).
type dropFirstAnswer struct {
	next    http.Handler
	mu      sync.Mutex
	dropped *wire.Claim // the answer the host never saw
	body    []byte      // the same, as it was written
}

func (d *dropFirstAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	drop := r.URL.Path == wire.PathClaim && d.dropped == nil
	d.mu.Unlock()
	if !drop {
		d.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	d.next.ServeHTTP(rec, r)
	if rec.Code != http.StatusOK {
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		io.Copy(w, rec.Body)
		return
	}
	var c wire.Claim
	if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
		panic(err)
	}
	d.mu.Lock()
	d.dropped, d.body = &c, rec.Body.Bytes()
	d.mu.Unlock()
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

// Issue 11 §11 through the server: the first answer of a keyed claim is
// committed and then lost. The host asks again with the same key and gets
// the same attempt — job, generation, worker token, which renews — and
// the job has one attempt, not an orphan the reaper would count as a lost
// worker. The same key with another host's token is that host's own claim
// and never sees the attempt or its token. Without a key, the lost answer's
// attempt is an orphan: the next claim takes another job.
func TestClaimAnswerDroppedAfterCommit(t *testing.T) {
	ctx := context.Background()
	t.Run("with a key", func(t *testing.T) {
		f := newFixture(t)
		d := &dropFirstAnswer{next: f.srv.Handler()}
		hs := httptest.NewServer(d)
		t.Cleanup(hs.Close)
		wc := &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
		conv := f.newConversation()
		j := f.send(conv.ID, "hello")
		f.send(f.newConversation().ID, "another")
		req := wire.ClaimRequest{IdempotencyKey: "KEY0123456789ABCDEFGHIJKLMNOP"}
		if _, err := wc.Claim(ctx, f.hostToken, req); wire.Classify(err) != wire.Transient || err == nil {
			t.Fatalf("first claim: %v, want a transport error", err)
		}
		other := f.addHost("host-b")
		if c, err := wc.Claim(ctx, other, req); err != nil || c.JobID == j.ID || c.Replayed || c.WorkerToken == d.dropped.WorkerToken {
			t.Fatalf("another host with the same key: %+v, %v", c, err)
		}
		c, err := wc.Claim(ctx, f.hostToken, req)
		if err != nil {
			t.Fatal(err)
		}
		lost := d.dropped
		if !c.Replayed || c.JobID != j.ID || c.AttemptID != lost.AttemptID || c.LeaseGeneration != lost.LeaseGeneration ||
			c.WorkerToken != lost.WorkerToken || !c.LeaseExpiresAt.Equal(lost.LeaseExpiresAt) || c.HeldMS != lost.HeldMS {
			t.Fatalf("retried claim %+v, want the lost answer %+v", c, *lost)
		}
		if _, err := wc.Renew(ctx, c.WorkerToken, c.JobID, wire.RenewRequest{AttemptRef: ref(c)}); err != nil {
			t.Fatalf("renew with the replayed token: %v", err)
		}
		if got := f.job(j.ID); len(got.Attempts) != 1 || got.Attempts[0].State != wire.AttemptRunning {
			t.Fatalf("job after the retried claim: %+v", got)
		}
		if strings.Contains(f.logs.String(), req.IdempotencyKey) || strings.Contains(f.logs.String(), c.WorkerToken) {
			t.Fatal("a record holds the idempotency key or the worker token")
		}
	})
	t.Run("without a key", func(t *testing.T) {
		f := newFixture(t)
		d := &dropFirstAnswer{next: f.srv.Handler()}
		hs := httptest.NewServer(d)
		t.Cleanup(hs.Close)
		wc := &wire.Client{BaseURL: hs.URL, HTTP: hs.Client()}
		j := f.send(f.newConversation().ID, "hello")
		f.send(f.newConversation().ID, "another")
		if _, err := wc.Claim(ctx, f.hostToken, wire.ClaimRequest{}); err == nil {
			t.Fatal("first claim answered")
		}
		if c, err := wc.Claim(ctx, f.hostToken, wire.ClaimRequest{}); err != nil || c.JobID == j.ID {
			t.Fatalf("second claim without a key: %+v, %v; want another job", c, err)
		}
	})
}

// An idempotency key outside its bounds is refused as bad input.
func TestClaimKeyValidated(t *testing.T) {
	f := newFixture(t)
	for _, key := range []string{"short", "has a space but is long enough....", string(bytes.Repeat([]byte("k"), wire.MaxIdempotencyKey+1))} {
		body, _ := json.Marshal(wire.ClaimRequest{IdempotencyKey: key})
		f.expect(http.MethodPost, wire.PathClaim, f.hostToken, string(body), http.StatusBadRequest, wire.CodeInvalid)
	}
}

// A keyed claim asked again after its attempt's lease ran out, before the
// reaper superseded it, on each database: the answer is 204 with no body
// — nothing to claim, as documented — not a 503 from a second attempt
// under the same key; the turn queued behind is not claimed, a record
// says why, and once the reaper has superseded the attempt the same key
// claims again.
func TestClaimKeyTakenPastItsLease(t *testing.T) {
	onEachDatabase(t, func(t *testing.T, db database) {
		ctx := context.Background()
		f := newFixtureOn(t, db)
		first := f.send(f.newConversation().ID, "hello")
		body, _ := json.Marshal(wire.ClaimRequest{WaitMS: 30_000, IdempotencyKey: "LATEKEY0123456789ABCDEFGHIJ"})
		status, b := f.do(http.MethodPost, wire.PathClaim, f.hostToken, string(body))
		var c wire.Claim
		if err := json.Unmarshal(b, &c); status != http.StatusOK || err != nil || c.JobID != first.ID {
			t.Fatalf("first keyed claim: %d %s", status, b)
		}
		behind := f.send(f.newConversation().ID, "behind")
		f.clock.Advance(time.Duration(c.LeaseTTLMS)*time.Millisecond + time.Second)
		status, b = f.do(http.MethodPost, wire.PathClaim, f.hostToken, string(body))
		if status != http.StatusNoContent || len(b) != 0 {
			t.Fatalf("the key again past its lease: %d %q, want 204 and no body", status, b)
		}
		if j := f.job(behind.ID); j.State != wire.JobQueued || len(j.Attempts) != 0 {
			t.Fatalf("the turn behind after the late claim: %+v", j)
		}
		if !strings.Contains(f.logs.String(), controlplane.MsgClaimKeyTaken) {
			t.Fatalf("no %s record:\n%s", controlplane.MsgClaimKeyTaken, f.logs.String())
		}
		if _, err := f.st.Reap(ctx, store.ReapParams{Now: f.clock.Now(), MaxWorkerLost: 3}); err != nil {
			t.Fatal(err)
		}
		status, b = f.do(http.MethodPost, wire.PathClaim, f.hostToken, string(body))
		if err := json.Unmarshal(b, &c); status != http.StatusOK || err != nil || c.Replayed {
			t.Fatalf("the key after the reaper: %d %s, want a new claim", status, b)
		}
	})
}
