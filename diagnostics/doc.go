// Package diagnostics holds the names of the runner's structured records
// (R15, R18), one typed helper per record so that their fields cannot drift,
// and the error classifier that turns any error or HTTP status into a short
// class (R16).
//
// A failure record carries an operation, ids, a class and a status — never a
// request URL, a token, a response body or an error's text. The helpers take
// the error itself and classify it here, so no caller can pass text through.
//
// Which record tells what (operators, start here):
//
//	agent_attempt_claimed      a turn was claimed: job, attempt, worker, host
//	agent_control_failure      a control-plane call failed: op, class, status;
//	                           once per renewal outage (R17)
//	agent_heartbeat_retry      the outage goes on: consecutive failures, time
//	                           since the last acknowledgement, next delay
//	agent_heartbeat_recovered  renewal answered again after failures
//	agent_lease_expired        renewals went unanswered (timeouts, refused
//	                           connections) until the last acknowledgement was
//	                           a whole lease old; the turn was stopped
//	agent_lease_lost           the control plane said 409/410: the attempt is
//	                           no longer the live one; the turn was stopped
//	agent_credential_refused   401/403/404 on renewal: this attempt's worker
//	                           token is refused; that turn was stopped
//	agent_heartbeat_stopped    the owner ended renewal (turn finished/released)
//	agent_execution_timeout    the turn ran past its execution timeout
//	agent_turn_cancelled       the turn was cancelled (user cancel, drain)
//	agent_exit                 the agent process exited: code or signal
//	agent_config_ignored       a setting was ignored for its default (R12)
//	agent_events_dropped       events were dropped (buffer full, attempt over):
//	                           the running total
//	agent_turn_failed          a turn or its preparation failed: stage, class;
//	                           written whether or not the report gets through
//
// The turn child (runner/turn) writes these with the attempt's ids:
//
//	agent_turn_declined            preflight declined the turn before ACCEPT: class
//	agent_turn_accept_failed       ACCEPT could not be sent; nothing was done
//	agent_sandbox_unavailable      the sandbox could not be ensured: error_class
//	agent_activation_failed        the supervisor failed the activation
//	agent_native_boundary_mismatch the supervisor's native turn is not the settled one (R31)
//	agent_turn_interrupted         the agent's stream broke before its result
//	agent_turn_result_undelivered  the turn's result could not reach the daemon
//
// Every record name is a constant; TestRecordNamesAreConstants fails on a
// record written with a literal name anywhere in the module.
//
// Each ending of a turn leaves its own record (R18): none is inferred from a
// missing event.
//
// Anything in the runner may import diagnostics; it imports only wire.
package diagnostics
