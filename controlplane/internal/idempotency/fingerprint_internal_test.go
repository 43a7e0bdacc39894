package idempotency

import "testing"

func TestCanonicalJSON(t *testing.T) {
	cases := []struct {
		ct, body, want string
		ok             bool
	}{
		{"application/json", ` {"b":1, "a":[3,1,{"z":null,"y":true}]} `, `{"a":[3,1,{"y":true,"z":null}],"b":1}`, true},
		{"application/json; charset=utf-8", `{"n":1.0,"m":1e0,"k":-0,"big":123456789012345678901234567890}`, `{"big":123456789012345678901234567890,"k":-0,"m":1e0,"n":1.0}`, true},
		{"application/merge-patch+json", `{"s":"\u003c\/a\u003e"}`, `{"s":"</a>"}`, true},
		{"application/json", `{"a":1} {"b":2}`, "", false},
		{"application/json", `{"a":`, "", false},
		{"application/json", `  `, "", false},
		{"text/plain", `{"a":1}`, "", false},
		{"", `{"a":1}`, "", false},
	}
	for _, tc := range cases {
		got, ok := canonicalJSON(tc.ct, []byte(tc.body))
		if ok != tc.ok || string(got) != tc.want {
			t.Errorf("canonicalJSON(%q, %q) = %q, %v; want %q, %v", tc.ct, tc.body, got, ok, tc.want, tc.ok)
		}
	}
}
