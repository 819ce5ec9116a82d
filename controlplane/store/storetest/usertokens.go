package storetest

import (
	"context"
	"testing"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
)

// User tokens are kept by hash; a revoked one stays known (and revoked),
// so that it is never accepted again.
func testUserTokens(t *testing.T, st store.Store) {
	ctx := context.Background()
	if ts, err := st.ListUserTokens(ctx); err != nil || len(ts) != 0 {
		t.Fatalf("ListUserTokens of a new store = %+v, %v", ts, err)
	}
	a, err := st.CreateUserToken(ctx, "alice", Hash("rdu_a"), Operator, T0)
	if err != nil || a.ID == "" || a.Name != "alice" || !a.CreatedAt.Equal(T0) || a.RevokedAt != nil {
		t.Fatalf("CreateUserToken = %+v, %v", a, err)
	}
	b, err := st.CreateUserToken(ctx, "ci", Hash("rdu_b"), Operator, at(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.CreateUserToken(ctx, "again", Hash("rdu_a"), Operator, T0)
	wantErr(t, "CreateUserToken of a hash already kept", err, store.ErrExists)
	_, err = st.CreateUserToken(ctx, " ", Hash("rdu_c"), Operator, T0)
	wantErr(t, "CreateUserToken without a name", err, store.ErrInvalid)
	_, err = st.CreateUserToken(ctx, "x", nil, Operator, T0)
	wantErr(t, "CreateUserToken without a hash", err, store.ErrInvalid)

	got, err := st.UserTokenByHash(ctx, Hash("rdu_a"))
	if err != nil || got.ID != a.ID || got.RevokedAt != nil {
		t.Fatalf("UserTokenByHash = %+v, %v", got, err)
	}
	_, err = st.UserTokenByHash(ctx, Hash("rdu_nobody"))
	wantErr(t, "UserTokenByHash of an unknown token", err, store.ErrUnauthorized)

	r, err := st.RevokeUserToken(ctx, a.ID, Operator, at(time.Minute))
	if err != nil || r.RevokedAt == nil || !r.RevokedAt.Equal(at(time.Minute)) {
		t.Fatalf("RevokeUserToken = %+v, %v", r, err)
	}
	r, err = st.RevokeUserToken(ctx, a.ID, Operator, at(time.Hour))
	if err != nil || r.RevokedAt == nil || !r.RevokedAt.Equal(at(time.Minute)) {
		t.Fatalf("RevokeUserToken again = %+v, %v; want the first revocation kept", r, err)
	}
	_, err = st.RevokeUserToken(ctx, "utok_nope", Operator, T0)
	wantErr(t, "RevokeUserToken of an unknown id", err, store.ErrNotFound)
	got, err = st.UserTokenByHash(ctx, Hash("rdu_a"))
	if err != nil || got.RevokedAt == nil {
		t.Fatalf("UserTokenByHash of a revoked token = %+v, %v; want it, revoked", got, err)
	}

	ts, err := st.ListUserTokens(ctx)
	if err != nil || len(ts) != 2 || ts[0].ID != a.ID || ts[0].RevokedAt == nil || ts[1].ID != b.ID || ts[1].RevokedAt != nil {
		t.Fatalf("ListUserTokens = %+v, %v", ts, err)
	}
}
