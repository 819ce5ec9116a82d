// Package runner is the host daemon (`runnerd run`): the claim loop with its
// launch backoff (R37), one lifecycle per claimed attempt — persist, renew,
// launch the turn child through handover, finish or release — the host
// heartbeat, drain, the systemd notifications, the restart path over the
// state directory (P5, P6) and the Prometheus series.
//
// One attempt, in this order (issue 6, architecture "One turn"):
//
//	claim → persist (0600, atomic) → agent_attempt_claimed → renewer
//	      → `runnerd turn` with the payload on fd 3
//	      → not accepted: release (spawn failed, undelivered, declined) and
//	        count a launch failure; an unconfirmed child is reported failed
//	      → accepted: RESULT (or a report built from the last PROGRESS)
//	        → persist the report → send it → forget the attempt → stop renewal
//
// Lease loss of any kind stops the turn at once and nothing more is written
// about it. A cancel in a renewal answer stops the turn while renewal goes
// on (R13). The daemon never decides on local state alone after a restart:
// it asks the control plane first (restart.go).
//
// Only cmd/runnerd imports runner; runner imports heartbeat, handover,
// sandbox, settlement, diagnostics, wire and its own runner/turn contract.
package runner
