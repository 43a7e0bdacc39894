package config

import (
	"testing"
	"time"
)

// terminal_detached_timeout: default, file, environment, and the bounds.
func TestTerminalDetachedTimeout(t *testing.T) {
	if d := Default().TerminalDetachedTimeout; d != 5*time.Minute {
		t.Fatalf("default %v, want 5m", d)
	}
	c, err := Load("", true, env(map[string]string{"GANTRY_NODEAGENT_TERMINAL_DETACHED_TIMEOUT": "90s"}))
	if err != nil || c.TerminalDetachedTimeout != 90*time.Second {
		t.Fatalf("from the environment: %v, %v", c.TerminalDetachedTimeout, err)
	}
	for _, v := range []string{"9s", "25h", "soon", "-1m"} {
		var c Config
		if err := c.parse([]byte("terminal_detached_timeout = " + v + "\n")); err == nil {
			t.Fatalf("terminal_detached_timeout = %s accepted", v)
		}
	}
	c = Default()
	if err := c.parse([]byte("terminal_detached_timeout = 1h\n")); err != nil || c.TerminalDetachedTimeout != time.Hour {
		t.Fatalf("from the file: %v, %v", c.TerminalDetachedTimeout, err)
	}
}
