// Package integration holds the end-to-end and fault tests of runnerd: the
// real binaries, built once per test run, the reference control plane on
// SQLite, host daemons with the process sandbox backend and the demo agent,
// and a fault-injecting TCP proxy between a daemon and its control plane.
// Timings are scaled down through the binaries' flags (renewal every
// 300 ms, 100 ms request timeout, 50 ms retry, 1.2 s lease); tests wait by
// polling the user API with a deadline, or on process exits and socket
// reads, never by sleeping.
//
// The package has only tests; internal/fleet is the process harness
// that cmd/demo shares. Nothing imports it.
package integration
