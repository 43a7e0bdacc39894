package auth

import (
	"testing"
	"time"
)

func TestLoginPolicyLock(t *testing.T) {
	p := DefaultConfig().loginPolicy()
	want := map[int]time.Duration{1: 0, 4: 0, 5: time.Second, 6: 2 * time.Second, 10: 32 * time.Second,
		14: 512 * time.Second, 15: 15 * time.Minute, 1000: 15 * time.Minute}
	for n, d := range want {
		if got := p.Lock(n); got != d {
			t.Errorf("Lock(%d) = %v, want %v", n, got, d)
		}
	}
	if got := (Config{}).loginPolicy(); got != p {
		t.Errorf("zero config policy %+v, want the defaults %+v", got, p)
	}
}

func TestUsernameKeyNormalizes(t *testing.T) {
	if string(usernameKey(" Alice ")) != string(usernameKey("alice")) || string(usernameKey("alice")) == string(usernameKey("alice2")) {
		t.Fatal("usernameKey does not normalize case and surrounding space only")
	}
}
