// Package docker is the Docker backend of the sandbox: one retained
// container per conversation, found again by its labels, with a workspace
// volume that outlives it. The container's init is our own supervisor: the
// static runnerd binary is bind-mounted read-only and started as
// `runnerd supervise`, so any image works unchanged, and the supervisor's
// socket lives in a host directory bind-mounted for it.
//
// Everything this package creates carries the labels runnerd.managed=true,
// runnerd.host and runnerd.conversation; it never starts, stops or removes
// a container or volume that lacks them or that belongs to another host.
// Preflight only reads.
//
// Only the runner (and cmd, to build the engine client) imports this package.
package docker
