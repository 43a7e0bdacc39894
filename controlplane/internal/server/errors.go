package server

import (
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/controlplane/internal/db"
	"github.com/gantry-gpu/gantry/proto/api"
	"github.com/gantry-gpu/gantry/shared/apierr"
)

// errorMapper is the single exit for errors: it logs what clients must not see and
// writes the envelope.
type errorMapper struct {
	writer apierr.Writer
	log    *slog.Logger
	// denials challenges and audits every 401 and 403 (denials.go).
	denials *denials
}

func (m errorMapper) write(w http.ResponseWriter, r *http.Request, err error) {
	err = unavailable(r, err)
	status, _ := m.writer.Envelope(r, err)
	switch {
	case status >= 500:
		m.log.ErrorContext(r.Context(), "request failed", "status", status, "code", apierr.CodeOf(err), "err", err, "method", r.Method, "path", r.URL.Path)
	case status == http.StatusUnauthorized:
		// Authentication failures are warning-class incidents (seed §7.1 rule 4).
		m.log.WarnContext(r.Context(), "authentication failed", "code", apierr.CodeOf(err), "method", r.Method, "path", r.URL.Path)
	}
	m.denials.deny(w, r, err, status)
	m.writer.Write(w, r, err)
}

// UnavailableRetryAfter is the Retry-After of a 503 caused by the database: about the
// time a restarted or failed-over PostgreSQL takes to accept connections again.
const UnavailableRetryAfter = 5 * time.Second

// unavailable is where database unavailability becomes 503 service_unavailable with
// Retry-After, for every path: handlers, the bearer and node-token checks, the project
// check and the idempotency layer all write their errors through the mapper, so none of
// them needs to know. It answers 503 when
//
//   - the error chain holds a failure only the database driver produces (connection
//     refused, the server shutting down, no connection slot left, a connection closed
//     under a deadline), whatever the code: an error caused by one decided nothing;
//   - or the error is an internal_error or service_unavailable caused by a transport
//     failure or a context error (a pool acquire that waited out the deadline);
//   - or the request's own deadline (GANTRY_REQUEST_TIMEOUT) has passed and the error
//     chain holds that deadline.
//
// Other codes keep their answer: an upstream_error caused by a timeout of the payment
// provider is still 502, and a node probe that timed out is still the probe's 4xx.
func unavailable(r *http.Request, err error) error {
	e, isAPI := apierr.As(err)
	if isAPI && e.Code == apierr.ServiceUnavailable && e.RetryAfter > 0 {
		return err
	}
	code := apierr.CodeOf(err)
	switch {
	case db.IsDatabaseUnavailable(err):
	case (code == apierr.InternalError || code == apierr.ServiceUnavailable) && db.IsUnavailable(err):
	case r.Context().Err() != nil && db.IsUnavailable(err):
	default:
		return err
	}
	if isAPI && e.Code == apierr.ServiceUnavailable {
		out := *e // keep its message and details, add the header
		out.RetryAfter = UnavailableRetryAfter
		return &out
	}
	return apierr.New(apierr.ServiceUnavailable, "the database is not answering; retry later").
		WithRetryAfter(UnavailableRetryAfter).Wrap(err)
}

// paramError maps a parameter the generated wrapper could not bind. The contract
// validator runs first, so this is a second line of defence.
func (m errorMapper) paramError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		reqHeader *api.RequiredHeaderError
		reqParam  *api.RequiredParamError
		format    *api.InvalidParamFormatError
		unmarshal *api.UnmarshalingParamError
		tooMany   *api.TooManyValuesForParamError
	)
	switch {
	case errors.As(err, &reqHeader):
		if strings.EqualFold(reqHeader.ParamName, "X-Project-ID") {
			m.write(w, r, missingProject())
			return
		}
		m.write(w, r, apierr.Validation(reqHeader.ParamName, "header %s is required", reqHeader.ParamName))
	case errors.As(err, &reqParam):
		m.write(w, r, apierr.Validation(reqParam.ParamName, "%s is required", reqParam.ParamName))
	case errors.As(err, &format):
		m.write(w, r, apierr.Validation(format.ParamName, "%s has an invalid format", format.ParamName))
	case errors.As(err, &unmarshal):
		m.write(w, r, apierr.Validation(unmarshal.ParamName, "%s has an invalid value", unmarshal.ParamName))
	case errors.As(err, &tooMany):
		m.write(w, r, apierr.Validation(tooMany.ParamName, "%s was given more than once", tooMany.ParamName))
	default:
		m.write(w, r, apierr.New(apierr.InvalidRequest, "request could not be read").Wrap(err))
	}
}

// bodyError maps a body the strict server could not decode.
func (m errorMapper) bodyError(w http.ResponseWriter, r *http.Request, err error) {
	m.write(w, r, apierr.New(apierr.InvalidRequest, "request body is not valid JSON").With("field", "body").Wrap(err))
}

func missingProject() *apierr.Error {
	return apierr.New(apierr.InvalidRequest, "project context is required: send the X-Project-ID header").
		With("field", "X-Project-ID").With("reason", "project_context_missing")
}

func notFound(w http.ResponseWriter, r *http.Request, m errorMapper) {
	m.write(w, r, apierr.New(apierr.InvalidRequest, "no operation at %s %s", r.Method, r.URL.Path).WithStatus(http.StatusNotFound).With("reason", "route_not_found"))
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request, m errorMapper) {
	m.write(w, r, apierr.New(apierr.InvalidRequest, "method %s is not allowed here", r.Method).WithStatus(http.StatusMethodNotAllowed).With("reason", "method_not_allowed"))
}
