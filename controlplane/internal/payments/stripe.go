package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Stripe is the Stripe-style provider: PaymentIntents for top-ups, Refunds, and
// signed webhook events. It talks to BaseURL (https://api.stripe.com in production, a
// local fake in tests) with a secret API key.
type Stripe struct {
	BaseURL string
	APIKey  string
	// Secrets are the webhook endpoint secrets; any of them verifies (rotation).
	Secrets [][]byte
	HTTP    *http.Client
}

// ProviderStripe is the Stripe provider's name (the {provider} of the webhook path).
const ProviderStripe = "stripe"

// Metadata keys on provider objects that tie them to ours.
const (
	metaPaymentID = "gantry_payment_id"
	metaTenantID  = "gantry_tenant_id"
	metaRefundID  = "gantry_refund_id"
)

// maxProviderResponse bounds what we read from the provider.
const maxProviderResponse = 1 << 20

func (s *Stripe) Name() string { return ProviderStripe }

// ProviderError is a refusal or failure of the provider's API. Its text stays in logs.
type ProviderError struct {
	Status int
	Code   string
	Err    error
}

func (e *ProviderError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("provider: %v", e.Err)
	}
	return fmt.Sprintf("provider: status %d code %q", e.Status, e.Code)
}

func (e *ProviderError) Unwrap() error { return e.Err }

type stripeIntent struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"`
	Amount           int64             `json:"amount"`
	AmountReceived   int64             `json:"amount_received"`
	Currency         string            `json:"currency"`
	Status           string            `json:"status"`
	ClientSecret     string            `json:"client_secret"`
	Metadata         map[string]string `json:"metadata"`
	LastPaymentError *struct {
		Code string `json:"code"`
	} `json:"last_payment_error"`
}

func (pi stripeIntent) payment() ProviderPayment {
	p := ProviderPayment{
		ID: pi.ID, ClientSecret: pi.ClientSecret, Currency: strings.ToUpper(pi.Currency),
		AmountMinor: pi.Amount, CapturedMinor: pi.AmountReceived,
	}
	switch pi.Status {
	case "processing", "requires_capture":
		p.Status = StatusPending
	case "succeeded":
		p.Status = StatusSucceeded
	case "canceled":
		p.Status = StatusCanceled
	}
	if pi.LastPaymentError != nil {
		p.FailureCode = pi.LastPaymentError.Code
	}
	return p
}

// CreatePayment creates a PaymentIntent.
func (s *Stripe) CreatePayment(ctx context.Context, req PaymentRequest) (ProviderPayment, error) {
	form := url.Values{}
	form.Set("amount", strconv.FormatInt(req.AmountMinor, 10))
	form.Set("currency", strings.ToLower(req.Currency))
	form.Set("automatic_payment_methods[enabled]", "true")
	form.Set("metadata["+metaPaymentID+"]", req.PaymentID.String())
	form.Set("metadata["+metaTenantID+"]", req.TenantID.String())
	var pi stripeIntent
	if err := s.call(ctx, http.MethodPost, "/v1/payment_intents", form, "gantry-payment-"+req.PaymentID.String(), &pi); err != nil {
		return ProviderPayment{}, err
	}
	if pi.ID == "" || pi.Amount != req.AmountMinor || !strings.EqualFold(pi.Currency, req.Currency) {
		return ProviderPayment{}, &ProviderError{Err: errors.New("payment intent does not match the request")}
	}
	return pi.payment(), nil
}

// GetPayment reads a PaymentIntent.
func (s *Stripe) GetPayment(ctx context.Context, id string) (ProviderPayment, error) {
	var pi stripeIntent
	if err := s.call(ctx, http.MethodGet, "/v1/payment_intents/"+url.PathEscape(id), nil, "", &pi); err != nil {
		return ProviderPayment{}, err
	}
	return pi.payment(), nil
}

// Refund creates a Refund of a PaymentIntent.
func (s *Stripe) Refund(ctx context.Context, req RefundRequest) (ProviderRefund, error) {
	form := url.Values{}
	form.Set("payment_intent", req.ProviderPaymentID)
	form.Set("amount", strconv.FormatInt(req.AmountMinor, 10))
	form.Set("metadata["+metaPaymentID+"]", req.PaymentID.String())
	form.Set("metadata["+metaRefundID+"]", req.RefundID.String())
	var out struct {
		ID       string `json:"id"`
		Status   string `json:"status"`
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := s.call(ctx, http.MethodPost, "/v1/refunds", form, "gantry-refund-"+req.RefundID.String(), &out); err != nil {
		return ProviderRefund{}, err
	}
	if out.ID == "" || out.Amount != req.AmountMinor || !strings.EqualFold(out.Currency, req.Currency) {
		return ProviderRefund{}, &ProviderError{Err: errors.New("refund does not match the request")}
	}
	if out.Status == "failed" || out.Status == "canceled" {
		return ProviderRefund{}, &ProviderError{Code: "refund_" + out.Status}
	}
	return ProviderRefund{ID: out.ID, Status: out.Status}, nil
}

func (s *Stripe) call(ctx context.Context, method, path string, form url.Values, idemKey string, out any) error {
	if s.APIKey == "" || s.BaseURL == "" {
		return errNotConfigured
	}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(s.BaseURL, "/")+path, body)
	if err != nil {
		return &ProviderError{Err: err}
	}
	req.Header.Set("Authorization", "Bearer "+s.APIKey)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	client := s.HTTP
	if client == nil {
		client = &http.Client{Timeout: 15 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return &ProviderError{Err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxProviderResponse))
	if err != nil {
		return &ProviderError{Status: resp.StatusCode, Err: err}
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct {
				Code string `json:"code"`
				Type string `json:"type"`
			} `json:"error"`
		}
		_ = json.Unmarshal(raw, &e)
		code := e.Error.Code
		if code == "" {
			code = e.Error.Type
		}
		return &ProviderError{Status: resp.StatusCode, Code: code}
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return &ProviderError{Status: resp.StatusCode, Err: fmt.Errorf("decode response: %w", err)}
	}
	return nil
}

// VerifyWebhook checks the Stripe-Signature header.
func (s *Stripe) VerifyWebhook(signature string, body []byte, now time.Time) error {
	return VerifySignature(signature, body, s.Secrets, now)
}

var (
	eventIDPattern  = regexp.MustCompile(`^[A-Za-z0-9_-]{1,255}$`)
	eventTypeRegexp = regexp.MustCompile(`^[a-z0-9_.]{1,128}$`)
	currencyLower   = regexp.MustCompile(`^[a-z]{3}$`)
)

type stripeEvent struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Type    string `json:"type"`
	Created int64  `json:"created"`
	Data    struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

type stripeCharge struct {
	ID             string            `json:"id"`
	PaymentIntent  string            `json:"payment_intent"`
	Currency       string            `json:"currency"`
	AmountRefunded int64             `json:"amount_refunded"`
	Metadata       map[string]string `json:"metadata"`
	Refunds        *struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	} `json:"refunds"`
}

// ParseEvent reads a Stripe event. Types payments does not act on parse to KindIgnored
// with only their id and type checked.
func (s *Stripe) ParseEvent(body []byte) (Event, error) {
	var se stripeEvent
	if err := json.Unmarshal(body, &se); err != nil {
		return Event{}, fmt.Errorf("not a JSON event: %w", err)
	}
	if !eventIDPattern.MatchString(se.ID) || !eventTypeRegexp.MatchString(se.Type) || (se.Object != "" && se.Object != "event") {
		return Event{}, errors.New("event id or type missing or malformed")
	}
	ev := Event{ID: se.ID, Type: se.Type}
	if se.Created > 0 {
		ev.Created = time.Unix(se.Created, 0).UTC()
	}
	switch se.Type {
	case "payment_intent.processing":
		ev.Kind = KindPending
	case "payment_intent.succeeded":
		ev.Kind = KindSucceeded
	case "payment_intent.payment_failed":
		ev.Kind = KindFailed
	case "payment_intent.canceled":
		ev.Kind = KindCanceled
	case "charge.refunded":
		ev.Kind = KindRefunded
	default:
		return ev, nil
	}
	if len(se.Data.Object) == 0 {
		return Event{}, errors.New("event without data.object")
	}
	if ev.Kind == KindRefunded {
		var ch stripeCharge
		if err := json.Unmarshal(se.Data.Object, &ch); err != nil {
			return Event{}, fmt.Errorf("charge: %w", err)
		}
		if !eventIDPattern.MatchString(ch.PaymentIntent) || !currencyLower.MatchString(ch.Currency) || ch.AmountRefunded < 0 {
			return Event{}, errors.New("charge without payment_intent, currency or refunded amount")
		}
		ev.ObjectID, ev.Currency, ev.RefundedMinor = ch.PaymentIntent, strings.ToUpper(ch.Currency), ch.AmountRefunded
		if ch.Refunds != nil && len(ch.Refunds.Data) > 0 && eventIDPattern.MatchString(ch.Refunds.Data[0].ID) {
			ev.RefundID = ch.Refunds.Data[0].ID
		}
		return ev, nil
	}
	var pi stripeIntent
	if err := json.Unmarshal(se.Data.Object, &pi); err != nil {
		return Event{}, fmt.Errorf("payment intent: %w", err)
	}
	if !eventIDPattern.MatchString(pi.ID) || !currencyLower.MatchString(pi.Currency) || pi.Amount <= 0 || pi.AmountReceived < 0 {
		return Event{}, errors.New("payment intent without id, currency or amount")
	}
	ev.ObjectID, ev.Currency, ev.CapturedMinor = pi.ID, strings.ToUpper(pi.Currency), pi.AmountReceived
	if id, err := uuid.Parse(pi.Metadata[metaPaymentID]); err == nil {
		ev.PaymentID = id
	}
	if pi.LastPaymentError != nil && len(pi.LastPaymentError.Code) <= 64 {
		ev.FailureCode = pi.LastPaymentError.Code
	}
	if ev.Kind == KindSucceeded && pi.AmountReceived <= 0 {
		return Event{}, errors.New("succeeded payment intent without amount_received")
	}
	return ev, nil
}
