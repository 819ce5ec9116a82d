// Package settlement is what a turn says to the control plane about one
// attempt, and the exact rules for saying it again: the container record,
// admission and the prompt-once gate (R25, R30), settlement (R26–R28) under
// the receipt policy (ReceiptPolicy, R24); the shared_workspace_settled
// notice (R23) and the terminal report — finish, abandon or release — under
// the report policy (ReportPolicy, K1); event upload; and the fence: after
// a lease rejection nothing more about the attempt leaves the process.
//
// A Reporter owns an attempt's terminal report and its fence. The daemon
// holds one per attempt: it persists the Report a turn child hands it (or
// one it builds itself from the child's last Facts, R22, or a Release for a
// child that never accepted, R33) and passes it to Send, which retries
// every answer that is not a verdict until the report is acknowledged or
// refused (P2: sending again is harmless), and calls LeaseLost when renewal
// is rejected or the lease expires locally.
//
// A turn child uses one Session per attempt, built on its own Reporter, in
// this order:
//
//	s, _ := settlement.New(cfg)           // starts the event uploader
//	defer s.Close()                        // waits for it
//	s.RecordContainer(ctx, backend, id)    // before admission (R29)
//	adm, err := s.Admit(ctx, activationID) // ambiguous → no prompt, ever (R30)
//	turn, err := settlement.SendPrompt(ctx, adm, run) // once per receipt (R25)
//	s.Event(typ, data)                     // never blocks
//	b, err := s.Settle(ctx, adm, supervisorSettle)    // fails closed (R28)
//	s.Notify(ctx)                          // failure does not fail the turn (R23)
//	s.FlushEvents(ctx); s.Facts().Report(…) // handed to the daemon in RESULT
//
// (Session.Finish sends the report itself, for a caller without a daemon.)
// After a lease rejection — an answer 409 lease_lost, 401, 403, 404 or 410,
// or the owner's LeaseLost for a local expiry — neither writes anything
// more about the attempt.
//
// settlement imports wire, internal/retry and diagnostics (for its
// records); only the runner and the turn child it runs import it. It knows
// nothing of the sandbox: the prompt and the supervisor settlement reach it
// as functions.
package settlement
