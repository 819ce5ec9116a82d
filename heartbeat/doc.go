// Package heartbeat keeps a claimed attempt's lease alive: one Renewer per
// attempt, a timer that renews through wire.Client.Renew on a goroutine that
// lives for one renewal, with an HTTP client of its own (NewHTTPClient), plus
// the lease-timing rules the daemon checks at start-up (ResolveTimings).
//
// Cadence at the defaults (lease 120 s, interval 30 s, request timeout 10 s,
// retry 5 s): the first renewal goes 30 s after the claim; after an
// acknowledgement the next goes 30 s after it was sent; after a failure the
// next goes 5 s after the failure. With every read timing out that is 30, 45,
// 60, 75, 90 and 105 s after the claim, and the lease is given up at 120 s.
// Renewal never looks at the turn's progress: a silent turn keeps its lease.
//
// A Renewer ends with exactly one verdict (Renewer.Verdict); the owner must act on it:
//
//	Stopped            the owner called Stop (turn finished or released). Nothing to do.
//	Lost               the control plane answered 409 (or 410): another attempt
//	                   owns the job now. Stop the turn at once; write nothing more.
//	CredentialRefused  401, 403 or 404: this attempt's worker token is refused.
//	                   Stop that turn as for Lost. Other turns and the host go on.
//	Expired            no renewal was acknowledged for a whole lease, measured
//	                   from when the last acknowledged request was sent (the claim
//	                   counts as the first). The control plane may already have
//	                   given the job to someone else, so stop the turn as for Lost.
//
// Only the owner's Stop ends renewal: a cancelled turn keeps its lease while
// it drains (R13). A cancel request from the user arrives in a renewal answer
// and is passed on through Renewer.CancelRequested (P7).
//
// The lease the renewer counts with is the one the control plane granted,
// capped by the runner's own configured lease, so the local deadline is never
// later than the server's.
//
// The runner imports heartbeat; heartbeat imports diagnostics and wire.
package heartbeat
