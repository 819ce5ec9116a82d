// Package settlement is what a turn says to the control plane about one
// attempt, and the exact rules for saying it again: the receipt retry
// policy (R24), the container record, admission and the prompt-once gate
// (R25, R30), settlement and the shared_workspace_settled notice (R23,
// R26–R28), event upload, and the terminal report — finish or abandon —
// with the outer failure handler for preparation (R21, R22, R29).
//
// A turn uses one Session per attempt, in this order:
//
//	s, _ := settlement.New(cfg)           // starts the event uploader
//	defer s.Close()                        // waits for it
//	s.RecordContainer(ctx, backend, id)    // before admission (R29)
//	adm, err := s.Admit(ctx, activationID) // ambiguous → no prompt, ever (R30)
//	turn, err := settlement.SendPrompt(ctx, adm, run) // once per receipt (R25)
//	s.Event(typ, data)                     // never blocks
//	b, err := s.Settle(ctx, adm, supervisorSettle)    // fails closed (R28)
//	s.Notify(ctx)                          // failure does not fail the turn (R23)
//	s.Finish(ctx, settlement.Result{…})    // finish or abandon, whatever events did (R21, R29)
//
// When the daemon sends the terminal report on the child's behalf, the
// child calls FlushEvents and hands over Facts().Report(…); the daemon,
// with its own Session for the attempt, persists that Report and passes it
// to Send (idempotent, P2), calling LeaseLost when renewal is rejected.
// A daemon releasing a turn its child never accepted uses Release (R33).
// The outer failure handler of preparation (R22) is the daemon's: a turn
// child that fails or dies before its RESULT gets a terminal report built
// from its last Facts (package runner), sent before renewal stops.
// After a lease rejection — an answer 409 lease_lost, 401, 403, 404 or 410,
// or the owner's LeaseLost for a local expiry — the Session writes nothing
// more about the attempt.
//
// settlement imports wire (and diagnostics for its records); only the
// runner and the turn child it runs import it. It knows nothing of the
// sandbox: the prompt and the supervisor settlement reach it as functions.
package settlement
