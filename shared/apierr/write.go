package apierr

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/gantry-gpu/gantry/shared/correlation"
)

// Envelope is the ErrorResponse of the contract (seed §7.1).
type Envelope struct {
	Code          Code           `json:"code"`
	Message       string         `json:"message"`
	CorrelationID string         `json:"correlation_id"`
	Details       map[string]any `json:"details,omitempty"`
}

// Writer writes envelopes for one service (its name goes into details.service).
type Writer struct {
	Service string
}

// Envelope builds the envelope for err as the request r would be answered.
func (wr Writer) Envelope(r *http.Request, err error) (int, Envelope) {
	e, ok := As(err)
	if !ok {
		e = Internal(err)
	}
	ctx := r.Context()
	details := make(map[string]any, len(e.Details)+3)
	for k, v := range e.Details {
		details[k] = v
	}
	details["service"] = wr.Service
	if tid, sid := correlation.TraceIDs(ctx); tid != "" {
		details["trace_id"] = tid
		details["span_id"] = sid
	}
	msg := e.Message
	if e.Code == InternalError {
		// A panic or a database error must never show its text.
		msg = "internal error"
	}
	return e.HTTPStatus(), Envelope{Code: e.Code, Message: msg, CorrelationID: correlation.ID(ctx), Details: details}
}

// Write answers r with the envelope for err.
func (wr Writer) Write(w http.ResponseWriter, r *http.Request, err error) {
	status, env := wr.Envelope(r, err)
	if e, ok := As(err); ok && e.RetryAfter > 0 {
		secs := int(e.RetryAfter.Seconds() + 0.999)
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(env)
}
