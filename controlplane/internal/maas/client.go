package maas

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/canonical/gomaasclient/client"
	"github.com/juju/gomaasapi/v2"

	"github.com/gantry-gpu/gantry/shared/apierr"
)

// Endpoint is how to reach one MAAS: its URL, the TLS policy and one API key.
type Endpoint struct {
	URL       string
	APIKey    string
	TLSVerify bool
	CABundle  string
}

// Dialer builds gomaasclient clients. Every call gets CallTimeout (gomaasclient's calls
// take no context, so the transport enforces it).
type Dialer struct {
	CallTimeout time.Duration
}

// DefaultCallTimeout bounds one MAAS API call.
const DefaultCallTimeout = 30 * time.Second

// Client returns a gomaasclient client for e.
func (d Dialer) Client(e Endpoint) (*client.Client, error) {
	tr, err := d.transport(e)
	if err != nil {
		return nil, err
	}
	c, err := client.GetClientWithTransport(strings.TrimRight(e.URL, "/"), e.APIKey, "2.0", tr)
	if err != nil {
		// Not wrapped: gomaasclient quotes the whole key in this error, and a wrapped cause
		// reaches the logs.
		return nil, apierr.Validation("api_key", "the API key must be consumer_key:token_key:token_secret")
	}
	return c, nil
}

func (d Dialer) transport(e Endpoint) (http.RoundTripper, error) {
	timeout := d.CallTimeout
	if timeout <= 0 {
		timeout = DefaultCallTimeout
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if !e.TLSVerify {
		tlsCfg.InsecureSkipVerify = true //nolint:gosec // the operator turned verification off for this site
	} else if e.CABundle != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(e.CABundle)) {
			return nil, apierr.Validation("ca_bundle", "ca_bundle holds no PEM certificate")
		}
		tlsCfg.RootCAs = pool
	}
	base := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       tlsCfg,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       90 * time.Second,
	}
	return timeoutTransport{rt: base, d: timeout}, nil
}

// timeoutTransport gives each request (including reading its body) at most d.
type timeoutTransport struct {
	rt http.RoundTripper
	d  time.Duration
}

func (t timeoutTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(req.Context(), t.d)
	resp, err := t.rt.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b cancelBody) Close() error { err := b.ReadCloser.Close(); b.cancel(); return err }

// Failure classifies a MAAS call's error.
type Failure string

// Failure kinds; the first four are also a site check's status.
const (
	FailUnreachable Failure = "unreachable"
	FailTLS         Failure = "tls_invalid"
	FailCredentials Failure = "credentials_invalid"
	FailUpstream    Failure = "upstream_error"
	FailConflict    Failure = "conflict"
	FailNotFound    Failure = "not_found"
)

// Classify says what kind of failure err is.
func Classify(err error) Failure {
	if se, ok := gomaasapi.GetServerError(err); ok {
		switch se.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return FailCredentials
		case http.StatusConflict:
			return FailConflict
		case http.StatusNotFound:
			return FailNotFound
		}
		return FailUpstream
	}
	var certErr *tls.CertificateVerificationError
	var unknownAuth x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalid x509.CertificateInvalidError
	var recErr tls.RecordHeaderError
	if errors.As(err, &certErr) || errors.As(err, &unknownAuth) || errors.As(err, &hostErr) || errors.As(err, &invalid) || errors.As(err, &recErr) {
		return FailTLS
	}
	msg := err.Error()
	if strings.Contains(msg, "x509:") || strings.Contains(msg, "tls:") {
		return FailTLS
	}
	var netErr net.Error
	if errors.As(err, &netErr) || strings.Contains(msg, "connection refused") || strings.Contains(msg, "no such host") {
		return FailUnreachable
	}
	// gomaasapi wraps some statuses in plain errors carrying the code.
	if strings.Contains(msg, "401") || strings.Contains(msg, "Unauthorized") {
		return FailCredentials
	}
	return FailUpstream
}

// reasons are Gantry's words for each failure (MAAS's text is never passed on).
var reasons = map[Failure]string{
	FailUnreachable: "MAAS did not answer (unreachable or timed out)",
	FailTLS:         "MAAS's TLS certificate did not verify",
	FailCredentials: "MAAS refused the API key",
	FailUpstream:    "MAAS answered with an error",
	FailConflict:    "MAAS refused the request: the machine is not in a state that allows it",
	FailNotFound:    "MAAS does not know the machine",
}

// Reason is the sentence recorded and returned for f.
func Reason(f Failure) string { return reasons[f] }

// upstream maps a MAAS call's error to the contract's upstream_error (502) with a
// details.reason; the raw error stays the wrapped cause, for the log only.
func upstream(what string, err error) *apierr.Error {
	f := Classify(err)
	reason := "maas_error"
	switch f {
	case FailUnreachable:
		reason = "maas_unreachable"
	case FailTLS:
		reason = "maas_tls_invalid"
	case FailCredentials:
		reason = "maas_credentials_invalid"
	case FailConflict:
		reason = "maas_conflict"
	case FailNotFound:
		reason = "maas_not_found"
	}
	return apierr.New(apierr.UpstreamError, "%s: %s", what, Reason(f)).With("reason", reason).Wrap(fmt.Errorf("maas %s: %w", what, err))
}
