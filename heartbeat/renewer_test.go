package heartbeat_test

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/runnerd/runnerd/diagnostics"
	"github.com/runnerd/runnerd/heartbeat"
	"github.com/runnerd/runnerd/internal/workerbatch"
	"github.com/runnerd/runnerd/wire"
)

func assertSends(t *testing.T, e *env, job string, want []time.Duration) {
	t.Helper()
	if got := e.ep.sent(job); !slices.Equal(got, want) {
		t.Fatalf("renewals of %s sent at %v, want %v", job, got, want)
	}
}

// expectVerdict waits for r's verdict and checks it and when it came.
func expectVerdict(t *testing.T, e *env, r *heartbeat.Renewer, want heartbeat.Outcome, at time.Duration) heartbeat.Verdict {
	t.Helper()
	<-r.Done()
	if got := e.since(); got != at {
		t.Fatalf("verdict after %v, want exactly %v", got, at)
	}
	v := r.Verdict()
	if v.Outcome != want {
		t.Fatalf("verdict %v (status %d), want %v", v.Outcome, v.Status, want)
	}
	return v
}

// aliveAfter lets d of fake time pass (a silent turn) and fails if the
// renewer gave a verdict meanwhile.
func aliveAfter(t *testing.T, r *heartbeat.Renewer, d time.Duration) {
	t.Helper()
	turn := make(chan struct{})
	go func() { time.Sleep(d); close(turn) }()
	select {
	case <-turn:
	case <-r.Done():
		t.Fatalf("verdict %v during a silent turn", r.Verdict().Outcome)
	}
	synctest.Wait() // a renewal due at this very instant has been answered
}

// R14, R2, R4, R10: with every read timing out, renewals go at 30, 45, 60,
// 75, 90 and 105 s and the lease is given up locally at exactly 120 s, with
// one control failure and retry records carrying the changing count.
// The same holds with the daemon's batching transport in the path: the
// first try is a batch of one, the later ones go alone once it timed out,
// each with the renewer's timeout as before.
func TestR14CadenceAllReadsTimeOut(t *testing.T) {
	t.Run("per_call", func(t *testing.T) { testAllReadsTimeOut(t, false) })
	t.Run("batched", func(t *testing.T) { testAllReadsTimeOut(t, true) })
}

func testAllReadsTimeOut(t *testing.T, batched bool) {
	synctest.Test(t, func(t *testing.T) {
		var e *env
		var tr *workerbatch.Transport
		if batched {
			e, tr = batchedEnv(t, hangFrom(0))
		} else {
			e = newEnv(t, hangFrom(0))
		}
		r := e.start(e.config(), e.attempt(jobID))
		v := expectVerdict(t, e, r, heartbeat.Expired, 120*time.Second)
		assertSends(t, e, jobID, secs(30, 45, 60, 75, 90, 105))
		if batched && tr.Batches() != 1 {
			// The first try timed out in a batch; the job's later tries go
			// on their own until one is answered (workerbatch's suspect).
			t.Fatalf("%d batch requests for 6 tries, want the first only", tr.Batches())
		}
		if !errors.Is(v.Err(), heartbeat.ErrLeaseExpired) || v.Renewals != 0 || v.LastAckSent != e.at(0) {
			t.Fatalf("verdict %+v", v)
		}

		wantNames := []string{diagnostics.MsgControlFailure}
		for range 5 {
			wantNames = append(wantNames, diagnostics.MsgHeartbeatRetry)
		}
		wantNames = append(wantNames, diagnostics.MsgLeaseExpired)
		if got := e.logs.names(); !slices.Equal(got, wantNames) {
			t.Fatalf("records %v, want %v", got, wantNames)
		}
		cf := e.logs.named(diagnostics.MsgControlFailure)[0].Attrs
		if cf[diagnostics.KeyClass] != diagnostics.ClassTimeout || cf[diagnostics.KeyStatus] != int64(0) || cf[diagnostics.KeyOp] != "renew" {
			t.Fatalf("control failure %v", cf)
		}
		for i, rec := range e.logs.named(diagnostics.MsgHeartbeatRetry) {
			a := rec.Attrs
			wantSince := int64(40_000 + 15_000*i) // failures at 40, 55, 70, 85, 100 s
			if a[diagnostics.KeyConsecutive] != int64(i+1) || a[diagnostics.KeySinceAck] != wantSince || a[diagnostics.KeyNextDelay] != int64(5000) {
				t.Fatalf("retry record %d: %v", i, a)
			}
		}
		ex := e.logs.named(diagnostics.MsgLeaseExpired)[0].Attrs
		if ex[diagnostics.KeyConsecutive] != int64(6) || ex[diagnostics.KeySinceAck] != int64(120_000) || ex[diagnostics.KeyClass] != diagnostics.ClassTimeout {
			t.Fatalf("expiry record %v", ex)
		}
	})
}

// R14 with the batching transport: eight attempts of one host renew on
// their own cadence (every 30 s, each answer its own), in fewer requests
// than renewals.
func TestR14BatchedRenewalsKeepTheirCadence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e, tr := batchedEnv(t, ok)
		var rs []*heartbeat.Renewer
		for i := range 8 {
			a := e.attempt(jobID)
			if i > 0 {
				a = e.attempt(fmt.Sprintf("job-b%d", i))
			}
			rs = append(rs, e.start(e.config(), a))
		}
		aliveAfter(t, rs[0], 6*time.Minute)
		for i, r := range rs {
			job := jobID
			if i > 0 {
				job = fmt.Sprintf("job-b%d", i)
			}
			assertSends(t, e, job, secs(every(30, 30, 360)...))
			if got, want := r.Lease().Deadline, e.at(360*time.Second+120*time.Second); got != want {
				t.Fatalf("%s: deadline %v after claim, want 480s", job, got.Sub(e.at(0)))
			}
		}
		if n := tr.Batches(); n >= 8*12 {
			t.Fatalf("%d batch requests for %d renewals: nothing went together", n, 8*12)
		}
		t.Logf("%d renewals in %d batch requests", 8*12, tr.Batches())
	})
}

// R14, R9, R7, R17: a silent six-minute turn keeps its lease with healthy
// renewal and through outages that recover at 100 s and at 105 s; after
// recovery the interval is 30 s again.
func TestR14SilentSixMinuteTurn(t *testing.T) {
	outage := append(secs(30, 45, 60, 75, 90, 105), secs(every(135, 30, 360)...)...)
	tests := []struct {
		name     string
		policy   policy
		sends    []time.Duration
		renewals int
		records  []string
	}{
		{"healthy", ok, secs(every(30, 30, 360)...), 12, nil},
		{"recovery at 100s", recoverAt(100 * time.Second), outage, 9, outageRecords(5)},
		{"recovery at 105s", recoverAt(105 * time.Second), outage, 9, outageRecords(5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, tt.policy)
				cfg := e.config()
				var (
					mu     sync.Mutex
					leases []heartbeat.Lease // what OnRenewed was told (K5)
				)
				cfg.OnRenewed = func(l heartbeat.Lease) { mu.Lock(); leases = append(leases, l); mu.Unlock() }
				r := e.start(cfg, e.attempt(jobID))
				aliveAfter(t, r, 6*time.Minute)
				assertSends(t, e, jobID, tt.sends)
				mu.Lock()
				if len(leases) != tt.renewals || leases[len(leases)-1] != r.Lease() {
					t.Fatalf("OnRenewed saw %d leases (last %+v), want %d ending with %+v", len(leases), leases[len(leases)-1], tt.renewals, r.Lease())
				}
				mu.Unlock()
				if got := e.logs.names(); !slices.Equal(got, tt.records) {
					t.Fatalf("records %v, want %v", got, tt.records)
				}
				last := tt.sends[len(tt.sends)-1]
				if got, want := r.Lease().Deadline, e.at(last+120*time.Second); got != want {
					t.Fatalf("deadline %v after claim, want %v", got.Sub(e.at(0)), want.Sub(e.at(0)))
				}
				if tt.records != nil {
					// The request sent at 90 s timed out at 100 s; the one at 105 s was answered.
					retries := e.logs.named(diagnostics.MsgHeartbeatRetry)
					if a := retries[len(retries)-1].Attrs; a[diagnostics.KeySinceAck] != int64(100_000) || a[diagnostics.KeyConsecutive] != int64(5) {
						t.Fatalf("last retry record %v", a)
					}
					rec := e.logs.named(diagnostics.MsgHeartbeatRecovered)[0].Attrs
					if rec[diagnostics.KeyConsecutive] != int64(5) || rec[diagnostics.KeySinceAck] != int64(105_000) {
						t.Fatalf("recovered record %v", rec)
					}
				}
				r.Stop()
				v := expectVerdict(t, e, r, heartbeat.Stopped, 6*time.Minute)
				if v.Err() != nil || v.Renewals != tt.renewals {
					t.Fatalf("verdict %+v", v)
				}
			})
		})
	}
}

// outageRecords is one outage with n retries, then recovery.
func outageRecords(n int) []string {
	out := []string{diagnostics.MsgControlFailure}
	for range n {
		out = append(out, diagnostics.MsgHeartbeatRetry)
	}
	return append(out, diagnostics.MsgHeartbeatRecovered)
}

// R8, R11: 409 (and 410) end the lease at once, 401/403/404 refuse the
// credential; neither is ever retried.
func TestR8R11TerminalAnswersNeverRetry(t *testing.T) {
	tests := []struct {
		name   string
		status int
		want   heartbeat.Outcome
		err    error
		record string
	}{
		{"409 conflict", 409, heartbeat.Lost, heartbeat.ErrLeaseLost, diagnostics.MsgLeaseLost},
		{"410 gone", 410, heartbeat.Lost, heartbeat.ErrLeaseLost, diagnostics.MsgLeaseLost},
		{"401 unauthorized", 401, heartbeat.CredentialRefused, heartbeat.ErrCredentialRefused, diagnostics.MsgCredentialRefused},
		{"403 forbidden", 403, heartbeat.CredentialRefused, heartbeat.ErrCredentialRefused, diagnostics.MsgCredentialRefused},
		{"404 not found", 404, heartbeat.CredentialRefused, heartbeat.ErrCredentialRefused, diagnostics.MsgCredentialRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The first renewal succeeds; the second gets the answer.
				e := newEnv(t, func(_ string, n int, _ time.Duration) reply {
					if n == 1 {
						return reply{}
					}
					return reply{status: tt.status}
				})
				r := e.start(e.config(), e.attempt(jobID))
				v := expectVerdict(t, e, r, tt.want, 60*time.Second)
				if v.Status != tt.status || !errors.Is(v.Err(), tt.err) || v.Renewals != 1 {
					t.Fatalf("verdict %+v", v)
				}
				time.Sleep(5 * time.Minute)
				assertSends(t, e, jobID, secs(30, 60))
				if got := e.logs.names(); !slices.Equal(got, []string{tt.record}) {
					t.Fatalf("records %v, want [%s]", got, tt.record)
				}
				if a := e.logs.all()[0].Attrs; a[diagnostics.KeyStatus] != int64(tt.status) {
					t.Fatalf("record %v", a)
				}
			})
		})
	}
}

// R4: 408, 5xx and transport failures are retried every 5 s while the
// lease can still be valid, then the lease expires at 120 s.
func TestR4TransientFailuresRetryEveryFiveSeconds(t *testing.T) {
	tests := []struct {
		name  string
		reply reply
		class string
	}{
		{"408", reply{status: 408}, "http_408"},
		{"500", reply{status: 500}, "http_500"},
		{"502", reply{status: 502}, "http_502"},
		{"503", reply{status: 503}, "http_503"},
		{"504", reply{status: 504}, "http_504"},
		{"connection dropped", reply{drop: true}, diagnostics.ClassEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, func(string, int, time.Duration) reply { return tt.reply })
				r := e.start(e.config(), e.attempt(jobID))
				expectVerdict(t, e, r, heartbeat.Expired, 120*time.Second)
				assertSends(t, e, jobID, secs(every(30, 5, 115)...))
				checkRetryRecords(t, e, tt.class, 17)
			})
		})
	}
	t.Run("connection refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, ok)
			e.l.SetRefusing(true)
			r := e.start(e.config(), e.attempt(jobID))
			expectVerdict(t, e, r, heartbeat.Expired, 120*time.Second)
			assertSends(t, e, jobID, nil)
			checkRetryRecords(t, e, diagnostics.ClassConnectionRefused, 17)
		})
	})
}

// checkRetryRecords: one control failure of class, then n retries 5 s apart
// (the failures are instantaneous, at 30, 35, … s), then the expiry.
func checkRetryRecords(t *testing.T, e *env, class string, n int) {
	t.Helper()
	recs := e.logs.all()
	if len(recs) != n+2 || recs[0].Msg != diagnostics.MsgControlFailure || recs[len(recs)-1].Msg != diagnostics.MsgLeaseExpired {
		t.Fatalf("records %v", e.logs.names())
	}
	if got := recs[0].Attrs[diagnostics.KeyClass]; got != class {
		t.Fatalf("class %v, want %s", got, class)
	}
	for i, rec := range recs[1 : n+1] {
		if rec.Msg != diagnostics.MsgHeartbeatRetry || rec.Attrs[diagnostics.KeyConsecutive] != int64(i+1) ||
			rec.Attrs[diagnostics.KeySinceAck] != int64(30_000+5_000*i) {
			t.Fatalf("record %d: %s %v", i+1, rec.Msg, rec.Attrs)
		}
	}
}

// R10: a hung endpoint ends in Expired exactly one lease after the last
// acknowledgement, measured from when that renewal was sent; a request
// still in flight at the deadline does not delay it.
func TestR10ExpiryOneLeaseAfterLastAck(t *testing.T) {
	t.Run("hung after two acknowledgements", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, hangFrom(61*time.Second))
			r := e.start(e.config(), e.attempt(jobID))
			v := expectVerdict(t, e, r, heartbeat.Expired, 180*time.Second)
			if v.LastAckSent != e.at(60*time.Second) || v.Renewals != 2 {
				t.Fatalf("verdict %+v", v)
			}
			assertSends(t, e, jobID, secs(30, 60, 90, 105, 120, 135, 150, 165))
		})
	})
	t.Run("acknowledged late counts from its send", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Sent at 30, answered at 38: the lease counts from 30.
			e := newEnv(t, func(_ string, n int, _ time.Duration) reply {
				if n == 1 {
					return reply{delay: 8 * time.Second}
				}
				return reply{hang: true}
			})
			r := e.start(e.config(), e.attempt(jobID))
			expectVerdict(t, e, r, heartbeat.Expired, 150*time.Second)
			assertSends(t, e, jobID, secs(30, 60, 75, 90, 105, 120, 135))
		})
	})
	t.Run("request in flight at the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			e := newEnv(t, hangFrom(0))
			cfg := e.config()
			cfg.LeaseTTL = 62 * time.Second
			r := e.start(cfg, e.attempt(jobID))
			expectVerdict(t, e, r, heartbeat.Expired, 62*time.Second)
			assertSends(t, e, jobID, secs(30, 45, 60))
		})
	})
}

// R10: the local lease is the granted one capped by the configured one, so
// the local deadline is never later than the server's.
func TestR10GrantedLeaseCapsLocalDeadline(t *testing.T) {
	tests := []struct {
		name    string
		claim   time.Duration // granted at the claim; every renewal hangs
		renewal time.Duration // granted by the first renewal; later ones hang
		expiry  time.Duration
		sends   []time.Duration
	}{
		{"claim grants 60s", 60 * time.Second, 0, 60 * time.Second, secs(30, 45)},
		{"claim grants 30s: renew every 10s", 30 * time.Second, 0, 30 * time.Second, secs(10, 25)},
		{"renewal grants 45s", 0, 45 * time.Second, 75 * time.Second, secs(30, 60)},
		{"renewal grants 300s, capped at 120s", 0, 300 * time.Second, 150 * time.Second, secs(30, 60, 75, 90, 105, 120, 135)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				e := newEnv(t, func(_ string, n int, _ time.Duration) reply {
					if n == 1 && tt.renewal != 0 {
						return reply{ttl: tt.renewal}
					}
					return reply{hang: true}
				})
				a := e.attempt(jobID)
				a.LeaseTTL = tt.claim
				r := e.start(e.config(), a)
				expectVerdict(t, e, r, heartbeat.Expired, tt.expiry)
				assertSends(t, e, jobID, tt.sends)
			})
		})
	}
}

// R13, P7: the user's cancel arrives in a renewal answer and is passed to
// the owner once; renewal goes on until the owner stops it.
func TestR13CancelDoesNotEndRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(_ string, n int, _ time.Duration) reply { return reply{cancel: n >= 2} })
		r := e.start(e.config(), e.attempt(jobID))
		<-r.CancelRequested()
		if got := e.since(); got != 60*time.Second {
			t.Fatalf("cancel seen after %v, want 60s", got)
		}
		aliveAfter(t, r, 4*time.Minute) // draining takes a while
		assertSends(t, e, jobID, secs(every(30, 30, 300)...))
		r.Stop()
		r.Stop() // twice is fine
		v := expectVerdict(t, e, r, heartbeat.Stopped, 300*time.Second)
		if v.Err() != nil || v.Renewals != 10 {
			t.Fatalf("verdict %+v", v)
		}
		if got := e.logs.names(); !slices.Equal(got, []string{diagnostics.MsgHeartbeatStopped}) {
			t.Fatalf("records %v", got)
		}
	})
}

// Stop ends a renewal whose request is in flight at once, as Stopped.
func TestStopDuringRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, hangFrom(0))
		r := e.start(e.config(), e.attempt(jobID))
		time.Sleep(33 * time.Second)
		r.Stop()
		expectVerdict(t, e, r, heartbeat.Stopped, 33*time.Second)
		if n := len(e.logs.named(diagnostics.MsgLeaseExpired)); n != 0 {
			t.Fatalf("%d expiry records after Stop", n)
		}
	})
}

// Between renewals a renewer is a timer, not a parked goroutine (issue 12
// §6): n renewers that have each been acknowledged and wait for their next
// renewal leave no goroutine running renewer code, and the bubble holds no
// more goroutines than before they started beyond the renewal connection's.
func TestIdleRenewersParkNoGoroutine(t *testing.T) {
	const n = 20
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, ok)
		before := runtime.NumGoroutine()
		rs := make([]*heartbeat.Renewer, n)
		for i := range rs {
			// Claims a second apart: the first renewals go one after the
			// other, at 11 … 30 s, over one pooled connection.
			a := e.attempt(jobID)
			a.ClaimSent = e.t0.Add(-time.Duration(i) * time.Second)
			rs[i] = e.start(e.config(), a)
		}
		aliveAfter(t, rs[0], 31*time.Second)
		for i, r := range rs {
			if l := r.Lease(); l.Sent != e.at(30*time.Second-time.Duration(i)*time.Second) {
				t.Fatalf("renewer %d: last acknowledgement sent %v after the claim, want its first renewal's", i, l.Sent.Sub(e.at(0)))
			}
		}
		if got := len(e.ep.sent(jobID)); got != n {
			t.Fatalf("%d renewals sent, want %d", got, n)
		}
		if got := renewerGoroutines(); len(got) != 0 {
			t.Fatalf("%d goroutines in heartbeat code between renewals, want none; the first:\n%s", len(got), got[0])
		}
		// The pooled connection's goroutines (client reader and writer,
		// server conn) are the only new ones.
		if grown := runtime.NumGoroutine() - before; grown > 3 {
			t.Fatalf("%d more goroutines with %d idle renewers, want at most the connection's 3", grown, n)
		}
		for _, r := range rs {
			r.Stop()
			if v := r.Verdict(); v.Outcome != heartbeat.Stopped || v.Renewals != 1 {
				t.Fatalf("verdict %+v", v)
			}
		}
	})
}

// renewerGoroutines are the stacks of the goroutines that are running code
// of package heartbeat (not its tests).
func renewerGoroutines() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "runnerd/runnerd/heartbeat.") {
			out = append(out, g)
		}
	}
	return out
}

// R11: a refused credential stops that attempt's renewal only; another
// attempt on the same client keeps renewing.
func TestR11CredentialRefusedStopsOnlyThatAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(job string, _ int, _ time.Duration) reply {
			if job == "job-2" {
				return reply{status: 401}
			}
			return reply{}
		})
		good := e.start(e.config(), e.attempt(jobID))
		bad := e.start(e.config(), e.attempt("job-2"))
		expectVerdict(t, e, bad, heartbeat.CredentialRefused, 30*time.Second)
		aliveAfter(t, good, 150*time.Second)
		assertSends(t, e, jobID, secs(every(30, 30, 180)...))
	})
}

// R16, R17: every record of a run with two outages of mixed failures and a
// final refusal carries no token, URL or body; each outage has exactly one
// agent_control_failure.
func TestR16R17RecordsOfAFailingRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEnv(t, func(_ string, n int, at time.Duration) reply {
			switch {
			case n == 1:
				return reply{}
			case n == 2:
				return reply{status: 503}
			case n == 3:
				return reply{drop: true}
			case n == 4:
				return reply{hang: true}
			case n <= 6:
				return reply{} // recovered
			case n <= 8:
				return reply{status: 502}
			case n == 9:
				return reply{} // recovered again
			}
			return reply{status: 403}
		})
		r := e.start(e.config(), e.attempt(jobID))
		<-r.Done()
		if v := r.Verdict(); v.Outcome != heartbeat.CredentialRefused {
			t.Fatalf("verdict %+v", v)
		}
		want := []string{
			diagnostics.MsgControlFailure, diagnostics.MsgHeartbeatRetry, diagnostics.MsgHeartbeatRetry, diagnostics.MsgHeartbeatRetry,
			diagnostics.MsgHeartbeatRecovered,
			diagnostics.MsgControlFailure, diagnostics.MsgHeartbeatRetry, diagnostics.MsgHeartbeatRetry,
			diagnostics.MsgHeartbeatRecovered,
			diagnostics.MsgCredentialRefused,
		}
		if got := e.logs.names(); !slices.Equal(got, want) {
			t.Fatalf("records %v, want %v", got, want)
		}
		if c := e.logs.named(diagnostics.MsgControlFailure); c[0].Attrs[diagnostics.KeyClass] != "http_503" || c[1].Attrs[diagnostics.KeyClass] != "http_502" {
			t.Fatalf("control failures %v", c)
		}
		for _, rec := range e.logs.all() {
			for k, v := range rec.Attrs {
				s := fmt.Sprint(v)
				for _, bad := range []string{token, bodyText, host, "http:", "/v1/", "Bearer"} {
					if strings.Contains(s, bad) || strings.Contains(rec.Msg, bad) {
						t.Errorf("record %s field %s = %q contains %q", rec.Msg, k, s, bad)
					}
				}
			}
		}
	})
}

func TestAttemptFromClaim(t *testing.T) {
	sent := time.Now()
	a := heartbeat.AttemptFromClaim(wire.Claim{JobID: "j", AttemptID: "a", LeaseGeneration: 3, LeaseTTLMS: 60_000, WorkerToken: token}, sent)
	want := heartbeat.Attempt{JobID: "j", AttemptID: "a", LeaseGeneration: 3, LeaseTTL: time.Minute, WorkerToken: token, ClaimSent: sent}
	if a != want {
		t.Fatalf("%+v, want %+v", a, want)
	}
}
