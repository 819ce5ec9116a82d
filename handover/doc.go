// Package handover is the protocol between the host daemon and the child
// process that runs one turn (`runnerd turn`): the parent's Launch, which
// starts the child with one end of a SOCK_SEQPACKET socket pair as fd 3 and
// proves what became of it, and the child's Child, which reads the payload and
// answers ACCEPT or DECLINE, then PROGRESS and RESULT.
//
// The point of the protocol is R33–R35: a claim may be given back only when
// the parent can prove the child never accepted it. Launch therefore answers
// exactly one of spawn failed, payload undelivered, declined (a DECLINE, or
// the descriptor closed without ACCEPT), unconfirmed (a live child that gave
// no valid answer until the parent ended it) or accepted; only the first
// three yield a Releasable, and nothing else can make one. An accepted turn
// ends with a result, an exit without result, or a kill; what follows is the
// lease protocol's business.
//
// The child is hardened: its own process group, no inherited descriptor
// beyond 0–3 (and 4, its re-attach socket), a filtered environment, the
// payload — which carries the worker token — only on the descriptor, never
// in argv or the environment.
//
// The child is not tied to the daemon's life (P5): no parent-death signal.
// Before ACCEPT, EOF on the descriptor ends it (nobody knows the turn began).
// After ACCEPT, a child with a re-attach socket (Config.Reattach, in the
// daemon's state directory) keeps its turn going, fenced by its own lease
// deadline, and waits there for the next daemon's Reattach, which checks the
// protocol version, renews the deadline and supervises it to its end; it
// keeps its RESULT until the daemon says it has it (KEPT). No thread is held
// per child, and two goroutines are: the supervisor, and one that reads the
// child's frames and waits for its exit together, parked on a per-child
// epoll set of the descriptor and a pidfd that the runtime's poller watches.
//
// The lease travels down with the turn (K5): PAYLOAD carries the lease as
// the daemon counts it and the execution deadline, both CLOCK_BOOTTIME
// instants, and a DEADLINE frame follows every acknowledged renewal. The
// child's Deadlines ends when either passes, even with the daemon frozen or
// gone, so the turn can stop its agent by itself.
//
// The runner imports the parent side; the child's main imports the child
// side. handover imports nothing of this module but internal/boottime.
package handover
