// Package storetest is the conformance suite of store.Store: one body of
// tests that every implementation must pass. Implementations call Run from
// their own tests with a function that opens a fresh, empty store.
//
// Only tests of store implementations import storetest.
package storetest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// T0 is the fake "now" every test starts from.
var T0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// TTL is the lease the tests ask for.
const TTL = 120 * time.Second

// Run runs every conformance test as a parallel subtest. open must return
// a fresh, empty store and arrange for it to be closed when t ends.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t, open(t))
		})
	}
}

var tests = []test{
	{"BasicFlow", testBasicFlow},
	{"Hosts", testHosts},
	{"UserTokens", testUserTokens},
	{"HostLifecycle", testHostLifecycle},
	{"Audit", testAudit},
	{"AuditEveryAction", testAuditEveryAction},
	{"Registration", testRegistration},
	{"HostInstance", testHostInstance},
	{"Registration_RefusalsWriteNothing", testRegistrationRefusals},
	{"Race_RegistrationLastUse", testRaceRegistrationLastUse},
	{"RotationGrace", testRotationGrace},
	{"AuthorizeAttempt", testAuthorizeAttempt},
	{"RenewAs_AuthorizesAndFencesInOneStatement", testRenewAs},
	{"WorkerCallsAs_SameAsTheOrdinaryCalls", testWorkerCallsAs},
	{"WorkerCallsAs_Refusals", testWorkerCallsAsRefused},
	{"Race_FinishAsVsEnqueue", testRaceFinishAsVsEnqueue},
	{"ConversationStates_OneRead", testConversationStates},
	{"S1_SandboxState", testS1SandboxState},
	{"S2_PinnedOnlyClaim", testS2PinnedOnlyClaim},
	{"ClaimSaysItsQueueWait", testClaimSaysItsQueueWait},
	{"ListJobs", testListJobs},
	{"AdminReads", testAdminReads},
	{"InvalidInput", testInvalidInput},
	{"TurnsRunOneAtATimeInOrder", testTurnsInOrder},
	{"EventsIdempotentBySeq", testEventsIdempotent},
	{"AdmissionIdempotent", testAdmissionIdempotent},
	{"P1_StaleGenerationWritesRefused", testP1StaleWritesRefused},
	{"P1_ExpiredLeaseWritesRefused", testP1ExpiredLeaseRefused},
	{"P2_SameFinishTwiceGetsFirstAnswer", testP2SameFinishTwice},
	{"P3_ReaperWaitsForGrace", testP3ReaperWaitsForGrace},
	{"P4_ResumeAfterAbsenceGivesFullLease", testP4ResumeAfterAbsence},
	{"P6_WorkerLostNotCountedAndCapped", testP6WorkerLostNotCounted},
	{"P7_Cancel", testP7Cancel},
	{"K2_SettledFinishLostKeepsConversation", testK2SettledFinishLostKeepsConversation},
	{"K10_InterruptedBoundaryKeepsConversation", testK10InterruptedBoundaryKeepsConversation},
	{"P6_AdmittedHostLossCounted", testP6AdmittedHostLossCounted},
	{"K3_AbsenceDecidedInTheGuard", testK3AbsenceDecidedInTheGuard},
	{"K3_RenewalsRaceTheResume", testK3RenewalsRaceTheResume},
	{"K3_AbsenceRecordNeverMovesBack", testK3AbsenceRecordNeverMovesBack},
	{"P8_RetentionReclaimsDetailKeepsTimeline", testP8RetentionReclaimsDetailKeepsTimeline},
	{"R19_LeaseOwnerExpiryAndTimestampedEvents", testR19LeaseOwnerAndEvents},
	{"R20_SupersededDoesNotAnnounceAnotherAttempt", testR20SupersededDoesNotAnnounceAnotherAttempt},
	{"R27_SettlementIdempotent", testR27SettlementIdempotent},
	{"R29_AbandonBeforeAdmissionKeepsConversation", testR29AbandonKeepsConversation},
	{"R30_AdmittedTurnNeverRequeued", testR30AdmittedTurnNeverRequeued},
	{"R30_AmbiguousAdmissionNeedsEvidence", testR30AmbiguousAdmissionNeedsEvidence},
	{"R31_UnrecoverableSessionLosesConversation", testR31UnrecoverableSessionLosesConversation},
	{"R32_LostConversationRefusesMessages", testR32LostConversationRefusesMessages},
	{"R35_ReaperQuarantinesAdmittedConversation", testR35ReaperQuarantinesAdmittedConversation},
	{"K13_QuarantinedConversationResumes", testK13QuarantinedConversationResumes},
	{"K13_UnverifiedQuarantineIsLost", testK13UnverifiedQuarantineIsLost},
	{"R36_ReleaseRefusedAfterAdmission", testR36ReleaseRefusedAfterAdmission},
	{"S3_DeleteConversation", testS3DeleteConversation},
	{"Race_S3_DeleteVsEnqueue", testRaceDeleteVsEnqueue},
	{"Affinity_TurnsGoToSandboxHost", testAffinityTurnsGoToSandboxHost},
	{"Affinity_OperatorLosesConversation", testAffinityOperatorLosesConversation},
	{"K7_ReleaseCapFailsJob", testK7ReleaseCapFailsJob},
	{"K7_BackoffJobNotInFrontOfOthers", testK7BackoffJobNotInFrontOfOthers},
	{"K8_ClusterIdentity", testK8ClusterIdentity},
	{"Routing_ClaimsMeetRequirements", testRoutingClaimsMeetRequirements},
	{"Routing_InvalidLabels", testRoutingInvalidLabels},
	{"Claim_IdempotencyKeyReplays", testClaimIdempotencyKey},
	{"Claim_KeyTakenPastItsLease", testClaimKeyTakenPastItsLease},
	{"BatchClaim_LimitDistinctOneTurnPerConversation", testBatchClaimLimitDistinct},
	{"BatchClaim_KeepsBackoffRoutingAffinityPause", testBatchClaimKeepsRules},
	{"BatchClaim_IdempotencyKeyReplaysTheBatch", testBatchClaimKeyReplays},
	{"WorkSignal_NewWorkWakesClaims", testWorkSignal},
	{"ClaimMany_TakesUpToOneTurnPerSlot", testClaimMany},
	{"Race_SameClaimKey", testRaceSameClaimKey},
	{"Race_BatchedClaimersEachJobOnce", testRaceManyBatchedClaimers},
	{"Race_ManyClaimersEachJobOnce", testRaceManyClaimers},
	{"Race_P1_StaleWritesVsNewClaim", testRaceStaleWritesVsNewClaim},
	{"Race_R36_ReleaseVsAdmission", testRaceReleaseVsAdmission},
	{"Race_ReaperVsLateFinish", testRaceReaperVsLateFinish},
	{"Race_EventsFollowerSeesEveryEventOnce", testRaceEventsFollowerSeesEveryEventOnce},
	{"Race_SameSeqUploads", testRaceSameSeqUploads},
	{"Invariants_RandomOperations", testInvariantsRandomOperations},
	{"S5_CauseStored", testS5CauseStored},
	{"Limits_Stored", testLimitsStored},
}

type test struct {
	name string
	fn   func(t *testing.T, st store.Store)
}

// Hash is how the server stores tokens: SHA-256.
func Hash(token string) []byte {
	h := sha256.Sum256([]byte(token))
	return h[:]
}

// fixture is one host and helpers around a store.
type fixture struct {
	t    *testing.T
	st   store.Store
	ctx  context.Context
	host store.Host
	n    int
	// tokens maps attempt ids to the worker tokens the fixture generated.
	tokens map[string]string
}

func newFixture(t *testing.T, st store.Store) *fixture {
	t.Helper()
	f := &fixture{t: t, st: st, ctx: context.Background(), tokens: map[string]string{}}
	f.host = f.newHost("host-a")
	return f
}

func (f *fixture) newHost(name string) store.Host {
	f.t.Helper()
	h, err := f.st.CreateHost(f.ctx, name, Hash("host-token-"+name), Operator, T0)
	if err != nil {
		f.t.Fatalf("CreateHost: %v", err)
	}
	return h
}

func (f *fixture) conversation() wire.Conversation {
	f.t.Helper()
	c, err := f.st.CreateConversation(f.ctx, wire.CreateConversationRequest{
		Title: "t", Image: "img:1", AgentCommand: []string{"agent", "--x"},
	}, T0)
	if err != nil {
		f.t.Fatalf("CreateConversation: %v", err)
	}
	return c
}

func (f *fixture) enqueue(convID, prompt string) wire.Job {
	f.t.Helper()
	j, err := f.st.EnqueueTurn(f.ctx, convID, prompt, T0)
	if err != nil {
		f.t.Fatalf("EnqueueTurn: %v", err)
	}
	return j
}

// claim claims the next job at now on the fixture's host; it fails the
// test if there is none.
func (f *fixture) claim(now time.Time) wire.Claim {
	f.t.Helper()
	c, ok := f.tryClaim(f.host, now)
	if !ok {
		f.t.Fatalf("Claim at %v: no job", now.Sub(T0))
	}
	return c
}

func (f *fixture) tryClaim(h store.Host, now time.Time) (wire.Claim, bool) {
	f.t.Helper()
	f.n++
	token := fmt.Sprintf("worker-%s-%d", h.ID, f.n)
	c, ok, err := f.st.Claim(f.ctx, store.ClaimParams{HostID: h.ID, LeaseTTL: TTL, WorkerTokenHash: Hash(token), Now: now})
	if err != nil {
		f.t.Fatalf("Claim: %v", err)
	}
	if ok {
		f.tokens[c.AttemptID] = token
	}
	return c, ok
}

func (f *fixture) job(id string) wire.Job {
	f.t.Helper()
	j, err := f.st.GetJob(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetJob: %v", err)
	}
	return j
}

func (f *fixture) conv(id string) wire.Conversation {
	f.t.Helper()
	c, err := f.st.GetConversation(f.ctx, id)
	if err != nil {
		f.t.Fatalf("GetConversation: %v", err)
	}
	return c
}

// events returns the types of a job's events of the given type.
func (f *fixture) events(jobID, typ string) []wire.JobEvent {
	f.t.Helper()
	all, err := f.st.JobEvents(f.ctx, jobID, 0, 0)
	if err != nil {
		f.t.Fatalf("JobEvents: %v", err)
	}
	var out []wire.JobEvent
	for _, e := range all {
		if e.Type == typ {
			out = append(out, e)
		}
	}
	return out
}

func ref(c wire.Claim) wire.AttemptRef {
	return wire.AttemptRef{AttemptID: c.AttemptID, LeaseGeneration: c.LeaseGeneration}
}

func (f *fixture) admit(c wire.Claim, now time.Time) wire.AdmissionReceipt {
	f.t.Helper()
	r, err := f.st.Admit(f.ctx, ref(c), "act-"+c.AttemptID, now)
	if err != nil {
		f.t.Fatalf("Admit: %v", err)
	}
	return r
}

func settlement(c wire.Claim, nativeTurn int64) wire.SettlementRequest {
	act := "act-" + c.AttemptID
	return wire.SettlementRequest{AttemptRef: ref(c), ActivationID: act,
		Supervisor: wire.SupervisorReceipt{ActivationID: act, ReceiptID: "rcpt-" + c.AttemptID, NativeTurn: nativeTurn}}
}

func (f *fixture) settle(c wire.Claim, nativeTurn int64, now time.Time) wire.Boundary {
	f.t.Helper()
	b, err := f.st.Settle(f.ctx, ref(c), settlement(c, nativeTurn), now)
	if err != nil {
		f.t.Fatalf("Settle: %v", err)
	}
	return b
}

func (f *fixture) finish(c wire.Claim, outcome string, now time.Time) wire.FinishResponse {
	f.t.Helper()
	r, err := f.st.Finish(f.ctx, ref(c), wire.FinishRequest{AttemptRef: ref(c), Outcome: outcome}, now)
	if err != nil {
		f.t.Fatalf("Finish(%s): %v", outcome, err)
	}
	return r
}

// runTurn claims, admits, settles and finishes the next job at now.
func (f *fixture) runTurn(now time.Time, nativeTurn int64) wire.Claim {
	f.t.Helper()
	c := f.claim(now)
	f.admit(c, now)
	f.settle(c, nativeTurn, now)
	f.finish(c, wire.OutcomeSucceeded, now)
	return c
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

func at(d time.Duration) time.Time { return T0.Add(d) }

func tokenOf(f *fixture, c wire.Claim) string { return f.tokens[c.AttemptID] }
