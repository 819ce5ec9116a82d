//go:build chaos_broken_fence

package sqlstore

// This file is compiled only with `-tags chaos_broken_fence`, which only
// the chaos campaign's own builds pass (integration/chaos and
// integration/chaos/checker's TestBrokenFenceBuildIsCaught): a normal
// `go build`, `make build`, the release images and every test binary of
// the suite leave it out and compile fence.go instead. It is a
// compile-time switch, not a runtime directive — no flag, environment
// variable, prompt or request can turn it on in a released binary (K12),
// because a released binary does not contain it.
//
// It breaks P1 on purpose, so that the campaign's checker shows it can
// fail: every fenced write of an attempt (renew, events, container,
// admission, settlement, notices, abandon, release, finish) then matches
// its attempt row whatever the report's lease generation, the attempt's
// state or its lease — a superseded attempt's reports are applied. The
// placeholders stay in place, so guardArgs binds them as before.
const fenceOpen, fenceClose = "((", ") OR 1 = 1)"

// fenceInGo off: what the broken statements let through counts as applied.
const fenceInGo = false
