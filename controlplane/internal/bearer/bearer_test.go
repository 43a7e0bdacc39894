package bearer

import (
	"net/http/httptest"
	"testing"
)

func TestChallenge(t *testing.T) {
	if got, want := Challenge(false), `Bearer realm="gantry"`; got != want {
		t.Fatalf("no credential: %q, want %q", got, want)
	}
	if got, want := Challenge(true), `Bearer realm="gantry", error="invalid_token"`; got != want {
		t.Fatalf("credential: %q, want %q", got, want)
	}
}

func TestInAuthorization(t *testing.T) {
	for _, c := range []struct {
		header []string
		want   bool
	}{
		{nil, false},
		{[]string{"Bearer abc"}, true},
		{[]string{"  bearer abc"}, true},
		{[]string{"Basic dXNlcjpwYXNz"}, false},
		{[]string{"Basic dXNlcjpwYXNz", "Bearer abc"}, true},
		{[]string{"Bearerabc"}, false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		for _, h := range c.header {
			r.Header.Add("Authorization", h)
		}
		if got := InAuthorization(r); got != c.want {
			t.Errorf("%q: %v, want %v", c.header, got, c.want)
		}
	}
}
