package terminal

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestRing(t *testing.T) {
	cases := []struct {
		name   string
		writes []string
		want   string
	}{
		{"empty", nil, ""},
		{"fits", []string{"ab", "cd"}, "abcd"},
		{"exactly full", []string{"abcd", "efgh"}, "abcdefgh"},
		{"wraps", []string{"abcdef", "ghij"}, "cdefghij"},
		{"wraps twice", []string{"abcdef", "ghij", "klmno"}, "hijklmno"},
		{"one write larger than the ring", []string{"ab", "0123456789"}, "23456789"},
		{"empty write", []string{"abc", ""}, "abc"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRing(8)
			var all string
			for _, w := range tc.writes {
				r.Write([]byte(w))
				all += w
				if r.Len() > 8 {
					t.Fatalf("ring holds %d bytes", r.Len())
				}
				want := all[max(0, len(all)-8):]
				if got := string(r.Bytes()); got != want {
					t.Fatalf("after %q: %q, want %q", w, got, want)
				}
			}
			if got := string(r.Bytes()); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRingIsACopy(t *testing.T) {
	r := newRing(4)
	r.Write([]byte("abcd"))
	b := r.Bytes()
	r.Write([]byte("ef"))
	if !bytes.Equal(b, []byte("abcd")) {
		t.Fatalf("snapshot changed to %q", b)
	}
}

// Walk every pair of states: exactly the table's moves are allowed.
func TestStateTransitions(t *testing.T) {
	all := []state{stateAttached, stateDetached, stateEnding, stateEnded}
	want := map[[2]state]bool{
		{stateAttached, stateAttached}: true, // a second stream replaces the first
		{stateAttached, stateDetached}: true,
		{stateAttached, stateEnding}:   true,
		{stateDetached, stateAttached}: true,
		{stateDetached, stateEnding}:   true,
		{stateEnding, stateEnded}:      true,
	}
	for _, from := range all {
		for _, to := range all {
			if got := allowed(from, to); got != want[[2]state{from, to}] {
				t.Errorf("%s → %s allowed = %v", from, to, got)
			}
		}
	}
	srv := New(&envs{}, Options{})
	s := &session{srv: srv, st: stateEnded}
	if s.to(stateAttached) || s.st != stateEnded {
		t.Fatal("an ended session was moved")
	}
}

func TestSessionEnviron(t *testing.T) {
	got := sessionEnviron(SessionEnv{Env: []string{"HOME=/home/u", "TERM=vt100", "novalue", "=x", "CUDA_VISIBLE_DEVICES=GPU-1"}}, "xterm-256color")
	want := []string{"HOME=/home/u", "CUDA_VISIBLE_DEVICES=GPU-1", "PATH=" + defaultPath, "TERM=xterm-256color"}
	if !slices.Equal(got, want) {
		t.Fatalf("environ = %q, want %q", got, want)
	}
	got = sessionEnviron(SessionEnv{Env: []string{"PATH=/opt/bin"}}, "vt100")
	if !slices.Equal(got, []string{"PATH=/opt/bin", "TERM=vt100"}) {
		t.Fatalf("environ = %q", got)
	}
}

func TestBuildCommand(t *testing.T) {
	cmd, err := buildCommand(SessionEnv{Shell: "/bin/sh", Env: []string{"HOME=/tmp"}}, nil, "xterm")
	if err != nil {
		t.Fatal(err)
	}
	if cmd.Path != "/bin/sh" || !slices.Equal(cmd.Args, []string{"-sh"}) || cmd.Dir != "/tmp" {
		t.Fatalf("login shell: %s %q in %s", cmd.Path, cmd.Args, cmd.Dir)
	}
	if !cmd.SysProcAttr.Setsid || !cmd.SysProcAttr.Setctty || cmd.SysProcAttr.Credential != nil {
		t.Fatalf("attrs = %+v", cmd.SysProcAttr)
	}

	cmd, err = buildCommand(SessionEnv{RealUser: true, UID: 1234, GID: 1235, Groups: []uint32{44}}, []string{"sh", "-c", "true"}, "xterm")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(cmd.Path, "/sh") || !slices.Equal(cmd.Args, []string{"sh", "-c", "true"}) || cmd.Dir != "/" {
		t.Fatalf("command: %s %q in %s", cmd.Path, cmd.Args, cmd.Dir)
	}
	if c := cmd.SysProcAttr.Credential; c == nil || c.Uid != 1234 || c.Gid != 1235 || !slices.Equal(c.Groups, []uint32{44}) {
		t.Fatalf("credential = %+v", cmd.SysProcAttr.Credential)
	}
}

func TestScopeArgs(t *testing.T) {
	got := scopeArgs(SessionEnv{RealUser: true, UID: 1001, GID: 1002, Slice: "user-1001.slice"}, "/bin/bash", nil)
	want := []string{"systemd-run", "--scope", "--quiet", "--collect", "--slice=user-1001.slice", "--uid=1001", "--gid=1002", "--", "/bin/bash", "-l"}
	if !slices.Equal(got, want) {
		t.Fatalf("login: %q, want %q", got, want)
	}
	got = scopeArgs(SessionEnv{Slice: "s.slice"}, "/usr/bin/python3", []string{"python3", "-q"})
	want = []string{"systemd-run", "--scope", "--quiet", "--collect", "--slice=s.slice", "--", "/usr/bin/python3", "-q"}
	if !slices.Equal(got, want) {
		t.Fatalf("command: %q, want %q", got, want)
	}
}

func TestLoginShellAndLookPath(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	if err := os.WriteFile(passwd, []byte("root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/usr/bin/zsh\nbroken:x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := passwdShell(passwd, "alice"); got != "/usr/bin/zsh" {
		t.Fatalf("alice's shell = %q", got)
	}
	if got := passwdShell(passwd, "bob"); got != "" {
		t.Fatalf("bob's shell = %q", got)
	}
	if got := loginShell(SessionEnv{Shell: "/bin/dash"}); got != "/bin/dash" {
		t.Fatalf("explicit shell = %q", got)
	}

	prog := filepath.Join(dir, "prog")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := lookPath("prog", "relative:"+dir); err != nil || p != prog {
		t.Fatalf("lookPath = %q, %v", p, err)
	}
	for _, name := range []string{"data", "missing", filepath.Join(dir, "data")} {
		if _, err := lookPath(name, dir); err == nil {
			t.Fatalf("lookPath(%q) succeeded", name)
		}
	}
	// A relative PATH entry is never searched (it would be the agent's directory).
	t.Chdir(dir)
	if _, err := lookPath("prog", "."); err == nil {
		t.Fatal("relative PATH entry searched")
	}
}
