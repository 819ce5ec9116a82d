package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/runnerd/runnerd/controlplane/store"
	"github.com/runnerd/runnerd/wire"
)

// apiError is a refusal: a status, a stable wire code and a plain-language
// message that never echoes a token or the request body.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d %s", e.status, e.code) }

func refuse(status int, code, message string) *apiError {
	return &apiError{status: status, code: code, message: message}
}

// invalid is a well-formed request with a wrong field.
func invalid(format string, args ...any) *apiError {
	return refuse(http.StatusBadRequest, wire.CodeInvalid, fmt.Sprintf(format, args...))
}

var (
	errNoRoute      = refuse(http.StatusNotFound, wire.CodeNotFound, "There is no such endpoint.")
	errMethod       = refuse(http.StatusMethodNotAllowed, wire.CodeMethodNotAllowed, "This endpoint does not take that method; the Allow header lists the ones it takes.")
	errEmptyBody    = refuse(http.StatusBadRequest, wire.CodeBadJSON, "The request body is empty; send one JSON object.")
	errBadJSON      = refuse(http.StatusBadRequest, wire.CodeBadJSON, "The request body is not valid JSON.")
	errNotObject    = refuse(http.StatusBadRequest, wire.CodeBadJSON, "The request body must be one JSON object.")
	errTrailingData = refuse(http.StatusBadRequest, wire.CodeBadJSON, "The request body has data after its JSON value.")
	errUnknownField = refuse(http.StatusBadRequest, wire.CodeUnknownField, "The request body has a field this server does not know.")
	errBodyTooLarge = refuse(http.StatusBadRequest, wire.CodeBodyTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", wire.MaxBodyBytes))
	errNoToken      = refuse(http.StatusUnauthorized, wire.CodeUnauthorized, "This call needs a bearer token.")
	errBadToken     = refuse(http.StatusUnauthorized, wire.CodeUnauthorized, "The token is not valid for this call.")
	errOtherAttempt = refuse(http.StatusForbidden, wire.CodeForbidden, "The worker token belongs to another attempt.")
	// A failure the store did not decide (its database unreachable, a
	// restart) is 503, which every caller retries within its own policy:
	// every write is fenced and idempotent, so trying again is safe.
	errInternal      = refuse(http.StatusServiceUnavailable, wire.CodeInternal, "The control plane could not complete this; try again.")
	errUnavailable   = refuse(http.StatusServiceUnavailable, wire.CodeInternal, "The control plane is shutting down; try again.")
	errConvLostPlain = refuse(http.StatusConflict, wire.CodeConversationLost,
		"This conversation is no longer available: an earlier response was interrupted and could not be recovered. Start a new conversation to continue.")
	errConvBusy = refuse(http.StatusConflict, wire.CodeConversationBusy,
		"A turn of this conversation is running or waiting; cancel it first, then delete the conversation.")
	errConvDeleted = refuse(http.StatusGone, wire.CodeGone,
		"This conversation was deleted; it takes no new messages. Start a new conversation to continue.")
)

// fromStore maps a store error to its refusal (the comments on the store's
// sentinels). ok is false for an error the store did not decide: a failure.
func fromStore(err error) (*apiError, bool) {
	var ae *apiError
	switch {
	case errors.As(err, &ae): // a refusal the handler judged itself
		return ae, true
	case errors.Is(err, store.ErrNotFound):
		return refuse(http.StatusNotFound, wire.CodeNotFound, "No such job, conversation or attempt."), true
	case errors.Is(err, store.ErrOtherAttempt):
		return errOtherAttempt, true
	case errors.Is(err, store.ErrForbidden):
		return refuse(http.StatusForbidden, wire.CodeForbidden, "The worker token belongs to another job."), true
	case errors.Is(err, store.ErrUnauthorized):
		return errBadToken, true
	case errors.Is(err, store.ErrLeaseLost):
		return refuse(http.StatusConflict, wire.CodeLeaseLost, "This attempt no longer holds the job's lease."), true
	case errors.Is(err, store.ErrAdmitted):
		return refuse(http.StatusConflict, wire.CodeAdmitted, "The job was admitted into its conversation; it cannot be released or abandoned."), true
	case errors.Is(err, store.ErrNotAdmitted):
		return refuse(http.StatusConflict, wire.CodeNotAdmitted, "The job has not been admitted into its conversation yet."), true
	case errors.Is(err, store.ErrConversationLost):
		return errConvLostPlain, true
	case errors.Is(err, store.ErrNotPending):
		return refuse(http.StatusConflict, wire.CodeNotPending, "That permission request is not waiting for an answer: it was answered, timed out, or its turn is over."), true
	case errors.Is(err, store.ErrConversationBusy):
		return errConvBusy, true
	case errors.Is(err, store.ErrConversationDeleted):
		return errConvDeleted, true
	case errors.Is(err, store.ErrGone):
		return refuse(http.StatusGone, wire.CodeGone, "This has already ended."), true
	case errors.Is(err, wire.ErrLimitUnsupported):
		// A limit no sandbox backend applies: the store says why.
		msg := err.Error()
		if _, detail, ok := strings.Cut(msg, ": "); ok {
			msg = detail
		}
		return refuse(http.StatusBadRequest, wire.CodeUnsupported, msg), true
	case errors.Is(err, store.ErrInvalid):
		// The store words its own detail after the sentinel; it never
		// holds a token.
		msg := err.Error()
		if _, detail, ok := strings.Cut(msg, store.ErrInvalid.Error()+": "); ok {
			msg = detail
		}
		return refuse(http.StatusBadRequest, wire.CodeInvalid, msg), true
	case errors.Is(err, store.ErrExists):
		return refuse(http.StatusConflict, wire.CodeInvalid, "That already exists."), true
	}
	return nil, false
}

// fail answers err. A store failure or anything undecided is a 503 and one
// record with the operation and the error's type, never its text.
// now reads the store's clock (K3); false after answering the failure.
func (s *Server) now(w http.ResponseWriter, r *http.Request, op string) (time.Time, bool) {
	t, err := s.cfg.Store.Now(r.Context())
	if err != nil {
		s.fail(w, r, op, err)
		return time.Time{}, false
	}
	return t, true
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, op string, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		writeError(w, ae)
		return
	}
	if ae, ok := fromStore(err); ok {
		if errors.Is(err, store.ErrLeaseLost) {
			s.cfg.Metrics.staleReports.WithLabelValues(op).Inc()
		}
		writeError(w, ae)
		return
	}
	if errors.Is(err, context.Canceled) && r.Context().Err() != nil {
		// The caller went away or the server is shutting down.
		writeError(w, errUnavailable)
		return
	}
	s.log.LogAttrs(r.Context(), slog.LevelError, MsgRequestFailed,
		slog.String("op", op), slog.Int("status", errInternal.status),
		slog.String("class", errorClass(err)))
	writeError(w, errInternal)
}

// errorClass names an error by its innermost type, never its text.
func errorClass(err error) string {
	for {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	return fmt.Sprintf("%T", err)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, wire.ErrorBody{Code: e.code, Message: e.message})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v) // a client that went away is not our failure
}

// decode reads r's body strictly into dst: at most wire.MaxBodyBytes, one
// JSON object holding each of the required keys, no unknown field,
// nothing after it, and nothing in any field that no store can keep
// (checkFields).
func decode(w http.ResponseWriter, r *http.Request, dst any, required ...string) *apiError {
	return decodeJSON(http.MaxBytesReader(w, r.Body, wire.MaxBodyBytes), dst, required...)
}

// decodeJSON is decode without the size limit, which the caller applies.
func decodeJSON(body io.Reader, dst any, required ...string) *apiError {
	dec := json.NewDecoder(body)
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return decodeError(err, true)
	}
	var extra json.RawMessage
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err == nil:
		return errTrailingData
	default:
		return decodeError(err, false)
	}
	if !isObject(raw) {
		return errNotObject // null would otherwise be taken as {}
	}
	strict := json.NewDecoder(bytes.NewReader(raw))
	strict.DisallowUnknownFields()
	if err := strict.Decode(dst); err != nil {
		return decodeError(err, true)
	}
	if e := checkRequired(raw, required); e != nil {
		return e
	}
	return checkFields(reflect.ValueOf(dst), "")
}

func decodeError(err error, first bool) *apiError {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return errBodyTooLarge
	case first && errors.Is(err, io.EOF):
		return errEmptyBody
	case !first:
		return errTrailingData
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no typed error for this one.
		return errUnknownField
	}
	return errBadJSON
}
