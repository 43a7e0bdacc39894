package command

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

var update = flag.Bool("update", false, "rewrite the --help golden files")

// buildBinary builds the real gantry binary; the help tests run it as a user would.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gantry")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/gantry-gpu/gantry/cli/cmd/gantry").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// commands walks the tree: every command a user can call, with its path.
func commands(c *cobra.Command, path []string, visit func(*cobra.Command, []string)) {
	visit(c, path)
	for _, sub := range c.Commands() {
		if sub.Hidden || sub.Name() == "help" {
			continue
		}
		commands(sub, append(append([]string(nil), path...), sub.Name()), visit)
	}
}

// TestHelpGolden runs `gantry ... --help` for every command through the built binary and
// compares it with testdata/help; every command must show examples.
func TestHelpGolden(t *testing.T) {
	bin := buildBinary(t)
	home := t.TempDir()
	n := 0
	commands((&app{}).root(), nil, func(c *cobra.Command, path []string) {
		n++
		if c.Example == "" {
			t.Errorf("gantry %s has no examples", strings.Join(path, " "))
		}
		cmd := exec.Command(bin, append(path, "--help")...)
		cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		if err := cmd.Run(); err != nil {
			t.Fatalf("gantry %s --help: %v\n%s", strings.Join(path, " "), err, errOut.String())
		}
		name := strings.Join(append([]string{"gantry"}, path...), "_") + ".golden"
		file := filepath.Join("testdata", "help", name)
		if *update {
			if err := os.WriteFile(file, out.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		want, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("%v (go test -run TestHelpGolden -update creates it)", err)
		}
		if !bytes.Equal(want, out.Bytes()) {
			t.Errorf("gantry %s --help differs from %s:\n--- got ---\n%s--- want ---\n%s", strings.Join(path, " "), file, out.String(), want)
		}
	})
	if n < 20 {
		t.Fatalf("walked %d commands; the tree lost some", n)
	}
}

// TestUsageErrorsAndCompletion: a bad flag or output format exits 2 with the message;
// completion scripts come out for the three shells.
func TestUsageErrorsAndCompletion(t *testing.T) {
	bin := buildBinary(t)
	home := t.TempDir()
	run := func(args ...string) (string, string, int) {
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"HOME=" + home, "XDG_CONFIG_HOME=" + home}
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		code := 0
		if ee, isExit := err.(*exec.ExitError); isExit {
			code = ee.ExitCode()
		}
		return out.String(), errOut.String(), code
	}
	for _, args := range [][]string{{"alloc", "list", "-o", "xml"}, {"alloc", "list", "--bogus"}, {"alloc", "get"}, {"alloc", "create"}} {
		_, errOut, code := run(args...)
		if code != ExitUsage || !strings.HasPrefix(errOut, "Error: ") {
			t.Errorf("gantry %v: exit %d, want %d\n%s", args, code, ExitUsage, errOut)
		}
	}
	if _, errOut, code := run("whoami"); code != ExitAuth || !strings.Contains(errOut, "gantry login") {
		t.Errorf("whoami without login: exit %d\n%s", code, errOut)
	}
	for shell, marker := range map[string]string{"bash": "__start_gantry", "zsh": "#compdef gantry", "fish": "complete -c gantry"} {
		out, errOut, code := run("completion", shell)
		if code != 0 || !strings.Contains(out, marker) {
			t.Errorf("completion %s: exit %d, no %q\n%s", shell, code, marker, errOut)
		}
	}
}
