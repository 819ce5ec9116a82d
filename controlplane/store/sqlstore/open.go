package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	msqlite "modernc.org/sqlite"       // also registers the "sqlite" driver
	sqlite3 "modernc.org/sqlite/lib"
)

// OpenSQLite opens (creating if needed) the SQLite database at path and
// migrates it. Writes go through one connection with BEGIN IMMEDIATE, so
// they queue in Go rather than meet SQLITE_BUSY, and the writes queued
// together commit together (sqliteWriter); reads use a separate pool. The
// journal is WAL; synchronous is FULL unless WithSynchronous says NORMAL.
func OpenSQLite(ctx context.Context, path string, opts ...Option) (*Store, error) {
	cfg := newConfig(opts)
	switch cfg.synchronous {
	case SyncNormal, SyncFull:
	default:
		return nil, fmt.Errorf("open sqlite: synchronous %q is neither NORMAL nor FULL", cfg.synchronous)
	}
	busy := strconv.FormatInt(cfg.busyTimeout.Milliseconds(), 10)
	common := url.Values{}
	common.Add("_pragma", "busy_timeout("+busy+")")
	common.Add("_pragma", "foreign_keys(1)")

	wq := url.Values{}
	wq["_pragma"] = append([]string{"journal_mode(WAL)", "synchronous(" + string(cfg.synchronous) + ")"}, common["_pragma"]...)
	w, err := sql.Open("sqlite", path+"?"+wq.Encode())
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	if err := w.PingContext(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite: %w", err)
	}

	rq := url.Values{}
	rq["_pragma"] = append([]string{"query_only(1)"}, common["_pragma"]...)
	r, err := sql.Open("sqlite", path+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	r.SetMaxOpenConns(cfg.readConns)
	r.SetMaxIdleConns(cfg.readConns)

	conn, err := w.Conn(ctx)
	if err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	sw := &sqliteWriter{turn: make(chan struct{}, 1), conn: conn, stmts: map[string]*sql.Stmt{}, work: newSignal()}
	if err := sw.watchWork(); err != nil {
		conn.Close()
		w.Close()
		r.Close()
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	s := &Store{w: w, r: newReadPool(r, true), d: sqlite, cfg: cfg, sw: sw, work: sw.work}
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	return s, nil
}

// OpenPostgres connects to the PostgreSQL database named by dsn (a pgx
// connection string or URL; a search_path parameter selects the schema) and
// migrates it. Several control-plane replicas may share one database.
func OpenPostgres(ctx context.Context, dsn string, opts ...Option) (*Store, error) {
	cfg := newConfig(opts)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(16)
	if err := db.PingContext(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	work := newSignal()
	l, err := newListener(dsn, work, cfg.listenObs)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	s := &Store{w: db, r: newReadPool(db, false), d: postgres, cfg: cfg, work: work, listen: l}
	s.rb, s.fb = s.newRenewBatcher(), s.newFinishBatcher()
	if err := s.migrate(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	return s, nil
}

// retryable reports a PostgreSQL deadlock or serialization failure, after
// which the whole transaction may simply run again.
func (s *Store) retryable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40001" || pe.Code == "40P01")
}

// WriterSynchronous reads PRAGMA synchronous on SQLite's writer
// connection, the one every write commits on: what K9 depends on, as the
// database itself says it, not as it was asked for. "" on PostgreSQL.
func (s *Store) WriterSynchronous(ctx context.Context) (Synchronous, error) {
	if s.d != sqlite {
		return "", nil
	}
	var n int
	err := s.write(ctx, func(tx txn) error {
		return tx.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&n)
	})
	if err != nil {
		return "", fmt.Errorf("read synchronous: %w", err)
	}
	switch n {
	case 1:
		return SyncNormal, nil
	case 2:
		return SyncFull, nil
	case 0:
		return "OFF", nil
	}
	return "EXTRA", nil
}

// isConstraint reports a unique violation of the named index on PostgreSQL.
func isConstraint(err error, name string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == name
}

// isUniqueViolation reports a unique constraint refusing a row.
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505"
	}
	var se *msqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE
}
