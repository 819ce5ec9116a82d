// Package docker is the Docker backend of the sandbox (sandbox.Backend):
// one retained container per conversation, found again by its labels, over
// a workspace volume that outlives it. The container's init is our own
// supervisor: the static runnerd binary (Config.RunnerdPath) is
// bind-mounted read-only and started as `runnerd supervise --socket …
// --workspace … --state … --id …`, so any image works unchanged; the
// supervisor's socket and its state (the native turn boundary) live in two
// host directories under Config.StateDir, bind-mounted for it, never in the
// workspace. When the agents' user is not root, the supervisor runs as root
// with CAP_SETUID, CAP_SETGID and CAP_KILL only and starts the agents as
// that user (--agent-user), so they cannot reach its state or its socket.
// A conversation's image is pulled, as Config.Pull says, only to create
// its container, with the credentials of the engine client's config.json
// (pull.go); BuildScratchImage builds one from local files where there is
// no registry.
//
// Everything the backend creates carries the labels runnerd.managed=true,
// runnerd.host and runnerd.conversation; it never starts, stops or removes
// a container or volume without them or with another host's. Preflight
// only reads. Security defaults (all capabilities dropped, no new
// privileges, network none, pids, memory and CPU limits, a read-only root,
// the image's non-root user) are Config fields whose zero value is the safe
// choice.
//
// Beyond sandbox.Backend the runner uses Alive (after a broken turn stream:
// was the container lost, R35?) and Sweep (periodically: remove the
// sandboxes of LOST or deleted conversations). Only the runner, its turn
// child, and cmd import this package.
package docker
