package command

import "testing"

func TestRefreshFromPaste(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"  rt_abc\n", "rt_abc"},
		{`{"access_token":"a","refresh_token":"rt_x","expires_in":900}`, "rt_x"},
	} {
		got, err := refreshFromPaste(c.in)
		if err != nil || got != c.want {
			t.Errorf("refreshFromPaste(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
	for _, bad := range []string{"", "{}", `{"access_token":"a"}`, "{not json", "two words"} {
		if got, err := refreshFromPaste(bad); err == nil {
			t.Errorf("refreshFromPaste(%q) = %q, want an error", bad, got)
		}
	}
}

func TestSSOStartURL(t *testing.T) {
	if got, want := ssoStartURL("https://g.example/", "acme corp"), "https://g.example/api/v1/auth/oidc/acme%20corp/start"; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}
