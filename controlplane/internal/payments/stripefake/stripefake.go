// Package stripefake is a local HTTP fake of the part of a Stripe-style payment API
// that Gantry uses (PaymentIntents, Refunds) and a builder of its signed webhook events,
// so payment tests and `make dev` never call out of the machine. It keeps state in
// memory, honours Idempotency-Key like the real API (same key: same answer), checks the
// bearer API key, and lets a test play the customer (Succeed, Fail) or the dashboard
// (DashboardRefund).
package stripefake

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Intent is a fake PaymentIntent.
type Intent struct {
	ID             string
	Amount         int64
	AmountReceived int64
	AmountRefunded int64
	Currency       string // lowercase, like Stripe
	Status         string
	ClientSecret   string
	Metadata       map[string]string
	FailureCode    string
	LatestRefundID string
}

// Refund is a fake Refund.
type Refund struct {
	ID            string
	PaymentIntent string
	Amount        int64
	Metadata      map[string]string
}

type stored struct {
	status int
	body   []byte
}

// Server is the fake API.
type Server struct {
	*httptest.Server
	APIKey string

	mu      sync.Mutex
	seq     int
	intents map[string]*Intent
	refunds []Refund
	idem    map[string]stored
	// refuseRefunds makes POST /v1/refunds fail (the provider declines).
	refuseRefunds bool
	requests      int
}

// New starts the fake; Close it when done.
func New(apiKey string) *Server {
	s := &Server{APIKey: apiKey, intents: map[string]*Intent{}, idem: map[string]stored{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payment_intents", s.createIntent)
	mux.HandleFunc("GET /v1/payment_intents/{id}", s.getIntent)
	mux.HandleFunc("POST /v1/refunds", s.createRefund)
	s.Server = httptest.NewServer(s.auth(mux))
	return s
}

func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requests++
		s.mu.Unlock()
		if r.Header.Get("Authorization") != "Bearer "+s.APIKey {
			writeErr(w, http.StatusUnauthorized, "invalid_request_error", "api_key_invalid")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeErr(w http.ResponseWriter, status int, typ, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": typ, "code": code, "message": code}})
}

func metadata(r *http.Request) map[string]string {
	out := map[string]string{}
	for k, v := range r.PostForm {
		if strings.HasPrefix(k, "metadata[") && strings.HasSuffix(k, "]") && len(v) > 0 {
			out[k[len("metadata["):len(k)-1]] = v[0]
		}
	}
	return out
}

// idempotent replays the stored answer of a repeated Idempotency-Key, else runs fn and
// stores its answer.
func (s *Server) idempotent(w http.ResponseWriter, r *http.Request, fn func() (int, any)) {
	key := r.Header.Get("Idempotency-Key")
	s.mu.Lock()
	defer s.mu.Unlock()
	if key != "" {
		if st, ok := s.idem[r.URL.Path+" "+key]; ok {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Idempotent-Replayed", "true")
			w.WriteHeader(st.status)
			_, _ = w.Write(st.body)
			return
		}
	}
	status, v := fn()
	body, _ := json.Marshal(v)
	if key != "" && status < 500 {
		s.idem[r.URL.Path+" "+key] = stored{status: status, body: body}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func errBody(typ, code string) map[string]any {
	return map[string]any{"error": map[string]any{"type": typ, "code": code, "message": code}}
}

func (s *Server) createIntent(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeErr(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid")
		return
	}
	s.idempotent(w, r, func() (int, any) {
		amount, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
		cur := r.PostForm.Get("currency")
		if err != nil || amount <= 0 || len(cur) != 3 || strings.ToLower(cur) != cur {
			return http.StatusBadRequest, errBody("invalid_request_error", "parameter_invalid")
		}
		s.seq++
		id := fmt.Sprintf("pi_fake%06d", s.seq)
		in := &Intent{
			ID: id, Amount: amount, Currency: cur, Status: "requires_payment_method",
			ClientSecret: id + "_secret_fake", Metadata: metadata(r),
		}
		s.intents[id] = in
		return http.StatusOK, intentJSON(in, true)
	})
}

func (s *Server) getIntent(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	in, ok := s.intents[r.PathValue("id")]
	var body map[string]any
	if ok {
		body = intentJSON(in, false)
	}
	s.mu.Unlock()
	if !ok {
		writeErr(w, http.StatusNotFound, "invalid_request_error", "resource_missing")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(body)
}

func (s *Server) createRefund(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeErr(w, http.StatusBadRequest, "invalid_request_error", "parameter_invalid")
		return
	}
	s.idempotent(w, r, func() (int, any) {
		if s.refuseRefunds {
			return http.StatusPaymentRequired, errBody("card_error", "refund_declined")
		}
		in, ok := s.intents[r.PostForm.Get("payment_intent")]
		if !ok {
			return http.StatusNotFound, errBody("invalid_request_error", "resource_missing")
		}
		amount, err := strconv.ParseInt(r.PostForm.Get("amount"), 10, 64)
		if err != nil || amount <= 0 {
			return http.StatusBadRequest, errBody("invalid_request_error", "parameter_invalid")
		}
		if in.Status != "succeeded" || amount > in.AmountReceived-in.AmountRefunded {
			return http.StatusBadRequest, errBody("invalid_request_error", "amount_too_large")
		}
		return http.StatusOK, s.refundLocked(in, amount, metadata(r))
	})
}

func (s *Server) refundLocked(in *Intent, amount int64, meta map[string]string) map[string]any {
	s.seq++
	ref := Refund{ID: fmt.Sprintf("re_fake%06d", s.seq), PaymentIntent: in.ID, Amount: amount, Metadata: meta}
	s.refunds = append(s.refunds, ref)
	in.AmountRefunded += amount
	in.LatestRefundID = ref.ID
	return map[string]any{
		"id": ref.ID, "object": "refund", "amount": amount, "currency": in.Currency,
		"payment_intent": in.ID, "status": "succeeded", "metadata": meta,
	}
}

func intentJSON(in *Intent, withSecret bool) map[string]any {
	m := map[string]any{
		"id": in.ID, "object": "payment_intent", "amount": in.Amount, "amount_received": in.AmountReceived,
		"currency": in.Currency, "status": in.Status, "metadata": maps.Clone(in.Metadata),
	}
	if withSecret {
		m["client_secret"] = in.ClientSecret
	}
	if in.FailureCode != "" {
		m["last_payment_error"] = map[string]any{"code": in.FailureCode}
	}
	return m
}

// RefuseRefunds makes the provider decline (or accept again) every refund.
func (s *Server) RefuseRefunds(refuse bool) {
	s.mu.Lock()
	s.refuseRefunds = refuse
	s.mu.Unlock()
}

// Intent returns a copy of a PaymentIntent.
func (s *Server) Intent(id string) (Intent, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.intents[id]
	if !ok {
		return Intent{}, false
	}
	return *in, true
}

// Refunds returns the refunds made so far.
func (s *Server) Refunds() []Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Refund(nil), s.refunds...)
}

// Requests counts API requests received.
func (s *Server) Requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

func (s *Server) set(id string, fn func(*Intent)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.intents[id]
	if !ok {
		panic("stripefake: no payment intent " + id)
	}
	fn(in)
}

// Succeed plays the customer paying: the intent captures its amount.
func (s *Server) Succeed(id string) {
	s.set(id, func(in *Intent) { in.Status, in.AmountReceived, in.FailureCode = "succeeded", in.Amount, "" })
}

// Process moves the intent to processing (e.g. a bank debit under way).
func (s *Server) Process(id string) { s.set(id, func(in *Intent) { in.Status = "processing" }) }

// Fail plays a declined payment attempt.
func (s *Server) Fail(id, code string) {
	s.set(id, func(in *Intent) { in.Status, in.FailureCode = "requires_payment_method", code })
}

// Cancel cancels the intent.
func (s *Server) Cancel(id string) { s.set(id, func(in *Intent) { in.Status = "canceled" }) }

// DashboardRefund refunds amount outside Gantry (the provider's dashboard).
func (s *Server) DashboardRefund(id string, amount int64) {
	s.set(id, func(in *Intent) { s.refundLocked(in, amount, nil) })
}

// Event builds the webhook body of an event of type typ about the intent's current
// state: payment_intent.* events carry the intent, charge.refunded a charge of it.
// Each call mints a new event id.
func (s *Server) Event(typ, intentID string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.intents[intentID]
	if !ok {
		panic("stripefake: no payment intent " + intentID)
	}
	s.seq++
	var obj map[string]any
	if strings.HasPrefix(typ, "charge.") {
		refunds := []any{}
		if in.LatestRefundID != "" {
			refunds = append(refunds, map[string]any{"id": in.LatestRefundID, "object": "refund"})
		}
		obj = map[string]any{
			"id": "ch_" + strings.TrimPrefix(in.ID, "pi_"), "object": "charge", "payment_intent": in.ID,
			"amount": in.Amount, "amount_captured": in.AmountReceived, "amount_refunded": in.AmountRefunded,
			"currency": in.Currency, "refunded": in.AmountRefunded == in.AmountReceived,
			"refunds": map[string]any{"object": "list", "data": refunds},
		}
	} else {
		obj = intentJSON(in, false)
	}
	body, _ := json.Marshal(map[string]any{
		"id": fmt.Sprintf("evt_fake%06d", s.seq), "object": "event", "type": typ, "api_version": "2024-06-20",
		"created": 1700000000 + int64(s.seq), "livemode": false, "data": map[string]any{"object": obj},
	})
	return body
}

// Sign returns the Stripe-Signature header of body at t, one v1 per secret.
func Sign(body []byte, t time.Time, secrets ...string) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	out := "t=" + ts
	for _, sec := range secrets {
		m := hmac.New(sha256.New, []byte(sec))
		m.Write([]byte(ts + "."))
		m.Write(body)
		out += ",v1=" + hex.EncodeToString(m.Sum(nil))
	}
	return out
}
