package controlplane

import (
	"context"
	"log/slog"
)

// Record names of the control plane. Like the runner's they carry ids,
// counts, classes and statuses, never a token, a body or an error's text.
const (
	MsgAttemptClaimed      = "controlplane_attempt_claimed"               // a claim was granted: job, attempt, host, generation, lease expiry
	MsgHostTokenInUse      = "controlplane_host_token_in_use"             // a heartbeat or claim refused 409 host_token_in_use: another instance of the host is live (host, op)
	MsgClaimKeyTaken       = "controlplane_claim_key_taken"               // a keyed claim came after its key's attempts' leases ran out, before the reaper superseded them: answered 204, nothing claimed (host)
	MsgLeasesResumed       = "controlplane_leases_resumed"                // live leases were extended after the control plane's own absence
	MsgReaped              = "controlplane_reaped"                        // the reaper superseded expired attempts
	MsgDetailReclaimed     = "controlplane_detail_reclaimed"              // the retention sweep dropped old jobs' detail
	MsgReaperFailed        = "controlplane_reaper_failed"                 // a reaper or retention pass failed: stage, class
	MsgRequestFailed       = "controlplane_request_failed"                // a request failed inside the server (500): op, class
	MsgLostByOperator      = "controlplane_conversation_lost_by_operator" // an operator marked a conversation LOST
	MsgConversationDeleted = "controlplane_conversation_deleted"          // its owner deleted a conversation (S3): conversation_id
	MsgStopping            = "controlplane_stopping"                      // shutdown began
	MsgHostChanged         = "controlplane_host_changed"                  // an operator paused, resumed, removed a host or rotated its token
	MsgHostRegistered      = "controlplane_host_registered"               // a daemon registered itself with a registration token: host, version (never a token)
	MsgTLSReloaded         = "controlplane_tls_reloaded"                  // SIGHUP: the TLS pair was read again; new connections get it (subject, not_after)
	MsgTLSReloadFailed     = "controlplane_tls_reload_failed"             // SIGHUP: the new TLS pair could not be used (reason names the file and why); the old one stays
	MsgWorkListen          = "controlplane_work_listen"                   // PostgreSQL: the store began listening for new work (listening) or its connection failed (class); claims then wake by the re-check
)

// WorkListenObserver records the PostgreSQL store's listener for new work
// (sqlstore.WithWorkListenObserver): listening again, or its connection
// failed (class), after which waiting claims wake by the re-check alone
// until it listens again.
func WorkListenObserver(log *slog.Logger) func(error) {
	return func(err error) {
		if err != nil {
			log.LogAttrs(context.Background(), slog.LevelWarn, MsgWorkListen, slog.Bool("listening", false), slog.String("class", errorClass(err)))
			return
		}
		log.LogAttrs(context.Background(), slog.LevelInfo, MsgWorkListen, slog.Bool("listening", true))
	}
}
