package command

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gantry-gpu/gantry/cli/internal/apiclient"
	"github.com/gantry-gpu/gantry/proto/api"
)

func TestMoneyIsExactMinorUnits(t *testing.T) {
	for _, c := range []struct {
		m    api.Money
		want string
	}{
		{api.Money{AmountMinor: 12345, Currency: "USD"}, "123.45 USD"},
		{api.Money{AmountMinor: 5, Currency: "EUR"}, "0.05 EUR"},
		{api.Money{AmountMinor: -250, Currency: "USD"}, "-2.50 USD"},
		{api.Money{AmountMinor: 1500, Currency: "JPY"}, "1500 JPY"},
		{api.Money{AmountMinor: 1234, Currency: "KWD"}, "1.234 KWD"},
	} {
		if got := money(c.m); got != c.want {
			t.Errorf("money(%+v) = %q, want %q", c.m, got, c.want)
		}
	}
}

func TestParseMinor(t *testing.T) {
	for _, c := range []struct {
		in, cur string
		want    int64
		bad     bool
	}{
		{"500", "USD", 50000, false}, {"500.5", "USD", 50050, false}, {"0.01", "USD", 1, false},
		{"1.234", "USD", 0, true}, {"12", "JPY", 12, false}, {"1.5", "JPY", 0, true},
		{"-3", "USD", 0, true}, {"abc", "USD", 0, true}, {"", "USD", 0, true},
	} {
		got, err := parseMinor(c.in, c.cur)
		if (err != nil) != c.bad || got != c.want {
			t.Errorf("parseMinor(%q, %s) = %d, %v; want %d, bad=%v", c.in, c.cur, got, err, c.want, c.bad)
		}
	}
}

func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{&apiclient.Error{Status: 401, Code: "token_expired"}, ExitAuth},
		{&apiclient.Error{Status: 403, Code: "insufficient_permissions"}, ExitDenied},
		{&apiclient.Error{Status: 404, Code: "allocation_not_found"}, ExitNotFound},
		{&apiclient.Error{Status: 409, Code: "node_offline"}, ExitConflict},
		{&apiclient.Error{Status: 422, Code: "validation_error"}, ExitInvalid},
		{&apiclient.Error{Status: 402, Code: "insufficient_balance"}, ExitLimit},
		{&apiclient.Error{Status: 503, Code: "service_unavailable"}, ExitUnavailable},
		{fmt.Errorf("wrapped: %w", &apiclient.LoginExpiredError{}), ExitAuth},
		{apiclient.ErrNotLoggedIn, ExitAuth},
		{usageErr(errors.New("x")), ExitUsage},
		{errors.New("dial tcp: refused"), ExitError},
	} {
		if got := exitCode(c.err); got != c.want {
			t.Errorf("exitCode(%v) = %d, want %d", c.err, got, c.want)
		}
	}
}
