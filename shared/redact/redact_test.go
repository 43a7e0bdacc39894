package redact

import (
	"strings"
	"testing"
)

func TestJSONScrubsNestedSecrets(t *testing.T) {
	in := `{"id":"1","access_token":"a","nested":{"Password":"p","ok":1},"list":[{"client_secret":"s"}],"private_key":"k","authorization":"b"}`
	out, ok := JSON([]byte(in))
	if !ok {
		t.Fatal("not json")
	}
	for _, leak := range []string{`"a"`, `"p"`, `"s"`, `"k"`, `"b"`} {
		if strings.Contains(string(out), leak) {
			t.Fatalf("leaked %s in %s", leak, out)
		}
	}
	if !strings.Contains(string(out), `"ok":1`) || !strings.Contains(string(out), `"id":"1"`) {
		t.Fatalf("lost plain fields: %s", out)
	}
}

func TestJSONRejectsNonJSON(t *testing.T) {
	for _, in := range []string{"", "hello", "{"} {
		if _, ok := JSON([]byte(in)); ok {
			t.Fatalf("%q accepted", in)
		}
	}
}

func TestFirstSecretField(t *testing.T) {
	if _, ok := FirstSecretField(map[string]any{"node_id": "x", "ids": []any{"a"}}); ok {
		t.Fatal("false positive")
	}
	if k, ok := FirstSecretField(map[string]any{"x": []any{map[string]any{"refresh_token": "t"}}}); !ok || k != "refresh_token" {
		t.Fatalf("got %q %v", k, ok)
	}
}
