package sqlstore

import (
	"context"
	"database/sql"
	"sync"
)

// maxReadStmts bounds the read pool's prepared statements: a query built
// with a varying number of placeholders (an IN list) is a statement of
// its own for each length, and the ones past the bound are prepared for
// their one use, as database/sql does.
const maxReadStmts = 128

// readPool is the pool reads run on. On SQLite it prepares each query
// once (database/sql would parse it anew on every call, about half of a
// token lookup's CPU) and keeps the statement, which database/sql
// prepares again on each of the pool's connections as it needs; on
// PostgreSQL it is the pool as it is, whose driver keeps its own cache of
// prepared statements.
type readPool struct {
	*sql.DB
	prepare bool // SQLite: keep prepared statements

	mu    sync.Mutex           // guards stmts
	stmts map[string]*sql.Stmt // by query; at most maxReadStmts
}

func newReadPool(db *sql.DB, prepare bool) *readPool {
	return &readPool{DB: db, prepare: prepare, stmts: map[string]*sql.Stmt{}}
}

// stmt is query's prepared statement, nil when it is not kept (PostgreSQL,
// the bound reached, or a query that does not prepare: the call without
// it then carries the error).
func (p *readPool) stmt(ctx context.Context, query string) *sql.Stmt {
	if !p.prepare {
		return nil
	}
	p.mu.Lock()
	st, ok := p.stmts[query]
	full := len(p.stmts) >= maxReadStmts
	p.mu.Unlock()
	if ok || full {
		return st
	}
	st, err := p.DB.PrepareContext(ctx, query)
	if err != nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if kept, ok := p.stmts[query]; ok {
		// Another call prepared it meanwhile.
		_ = st.Close()
		return kept
	}
	if len(p.stmts) >= maxReadStmts {
		_ = st.Close()
		return nil
	}
	p.stmts[query] = st
	return st
}

func (p *readPool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if st := p.stmt(ctx, query); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return p.DB.QueryContext(ctx, query, args...)
}

func (p *readPool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	if st := p.stmt(ctx, query); st != nil {
		return st.QueryRowContext(ctx, args...)
	}
	return p.DB.QueryRowContext(ctx, query, args...)
}

// Close closes the kept statements, then the pool.
func (p *readPool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var err error
	for q, st := range p.stmts {
		if cerr := st.Close(); cerr != nil && err == nil {
			err = cerr
		}
		delete(p.stmts, q)
	}
	if cerr := p.DB.Close(); err == nil {
		err = cerr
	}
	return err
}
