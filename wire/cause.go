package wire

// Cause is why a failed or interrupted turn ended: one of a closed list
// (S5), reported with the turn's finish, stored with the job and counted
// in metrics by cause. Evidence (FinishRequest.CauseEvidence) says what the
// cause was read from; docs/operations.md ("Sandbox lifecycle") says what
// is detected on which host.
type Cause string

// The closed list of causes. A runner reports only these; the control
// plane refuses any other (400) and itself sets CauseHostLost when its
// reaper ends an attempt that sent no report.
const (
	CauseAgentExit     Cause = "agent_exit"     // the agent exited with a non-zero code
	CauseAgentSignal   Cause = "agent_signal"   // a signal ended the agent (not the supervisor's stop)
	CauseOOMKilled     Cause = "oom_killed"     // the sandbox's memory cgroup OOM-killed the agent
	CausePidsExhausted Cause = "pids_exhausted" // the sandbox's pids limit refused a fork during the turn
	CauseDiskFull      Cause = "disk_full"      // a filesystem the agent writes is full (ENOSPC seen)
	CauseExecTimeout   Cause = "execution_timeout"
	CauseLeaseFenced   Cause = "lease_fenced"             // the lease was lost: expired or refused
	CauseCancelled     Cause = "cancelled"                // the user's cancel
	CauseDaemonRestart Cause = "daemon_restart_recovered" // a restarted daemon reported the attempt it found
	CauseHostLost      Cause = "host_lost"                // the host's daemon stopped the turn, or went silent
	CauseUnknown       Cause = "unknown"                  // none of the above could be told
)

// Causes is the closed list, in the order the docs and metrics show it.
var Causes = []Cause{CauseAgentExit, CauseAgentSignal, CauseOOMKilled, CausePidsExhausted, CauseDiskFull,
	CauseExecTimeout, CauseLeaseFenced, CauseCancelled, CauseDaemonRestart, CauseHostLost, CauseUnknown}

// Valid reports whether c is on the closed list.
func (c Cause) Valid() bool {
	for _, k := range Causes {
		if c == k {
			return true
		}
	}
	return false
}

// MaxCauseEvidenceBytes bounds FinishRequest.CauseEvidence.
const MaxCauseEvidenceBytes = 1024
