// Package chaos is the chaos campaign of runnerd (issue 15): a real fleet
// on one machine — a private PostgreSQL cluster, two control-plane replicas
// on it and three runnerd hosts, each replica and host in its own network
// namespace on a private bridge, the Docker sandbox backend on one host,
// every host registered with a registration token on its first start and
// given both replicas' addresses (runnerd run --control-plane A,B, each
// host preferring another), its idle sandboxes stopped after a short
// --sandbox-idle and woken by their next turn —
// driven by the demo agent through varied scripts while faults drawn from
// a seed hit it: toxiproxy's toxics on every host→replica path,
// drop_response (forwarded and committed, never answered), partitions of a
// host or a replica (its link down), kill -9, SIGSTOP/SIGCONT and restarts
// of daemons, turn children, supervisors and replicas, a replica's own
// clock minutes off, PostgreSQL restarted.
//
// Everything observed goes to a history (package checker's records): every
// request and answer between a host and a replica, recorded by an HTTP
// recorder in the test process between the fault proxy and the replica;
// every process start and exit; every prompt the agents received (their
// transcripts); every job's events and the final states; each host's
// state on Admin → Servers; the daemons' records of leases lost and of
// sandboxes stopped and woken. The checker turns it into the table of
// counts (a replica's kill or restart must cost no host its online state
// and no lease); the short campaign (TestChaos) asserts zero of each
// violation and runs in make test; `make chaos TURNS=… SEED=…` runs a long
// one and writes its table to docs/reliability.md.
//
// The package has only tests, and skewcp, the test-only main of a replica
// with a skewed clock. Nothing imports it.
package chaos
