package apptask_test

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/gantry-gpu/gantry/proto/fabric/apptask"
	fabricv1 "github.com/gantry-gpu/gantry/proto/gen/fabric/v1"
)

func valid() *fabricv1.AppStartTask {
	return &fabricv1.AppStartTask{
		AppInstanceId: "7b0c3c1e-2a59-4a4c-9a39-3f6f4f0e2d11", AllocationId: "1e9a6f0b-8d2c-4b5e-a7f1-0c3d2e1f4a5b",
		AppSlug: "jupyter", Version: "4.0", Command: []string{"jupyter", "lab", "--port={port}"},
		Env:         map[string]string{"A_B": "1"},
		HealthCheck: &fabricv1.AppHealthCheck{Type: apptask.HealthHTTP, HttpPath: "/api"},
	}
}

// TestValidateStartEdges checks every limit at its edge: the largest accepted value
// passes, one more fails.
func TestValidateStartEdges(t *testing.T) {
	if err := apptask.ValidateStart(valid()); err != nil {
		t.Fatal(err)
	}
	args := func(n, size int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = strings.Repeat("a", size)
		}
		return out
	}
	env := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["K"+strings.Repeat("_", i)] = "v"
		}
		return m
	}
	for name, c := range map[string]struct {
		mut func(*fabricv1.AppStartTask)
		ok  bool
	}{
		"max args":      {func(t *fabricv1.AppStartTask) { t.Command = args(apptask.MaxCommandArgs, 1) }, true},
		"too many args": {func(t *fabricv1.AppStartTask) { t.Command = args(apptask.MaxCommandArgs+1, 1) }, false},
		"max arg bytes": {func(t *fabricv1.AppStartTask) { t.Command = args(1, apptask.MaxArgBytes) }, true},
		"arg too long":  {func(t *fabricv1.AppStartTask) { t.Command = args(1, apptask.MaxArgBytes+1) }, false},
		"empty command": {func(t *fabricv1.AppStartTask) { t.Command = nil }, false},
		"empty argv0":   {func(t *fabricv1.AppStartTask) { t.Command = []string{""} }, false},
		"nul in arg":    {func(t *fabricv1.AppStartTask) { t.Command = []string{"a\x00b"} }, false},
		"max env":       {func(t *fabricv1.AppStartTask) { t.Env = env(apptask.MaxEnv) }, true},
		"too much env":  {func(t *fabricv1.AppStartTask) { t.Env = env(apptask.MaxEnv + 1) }, false},
		"bad env key":   {func(t *fabricv1.AppStartTask) { t.Env = map[string]string{"A-B": "1"} }, false},
		"env value too long": {func(t *fabricv1.AppStartTask) {
			t.Env = map[string]string{"A": strings.Repeat("v", apptask.MaxEnvValueBytes+1)}
		}, false},
		"port 65535":         {func(t *fabricv1.AppStartTask) { t.Port = 65535 }, true},
		"port 65536":         {func(t *fabricv1.AppStartTask) { t.Port = 65536 }, false},
		"uppercase uuid":     {func(t *fabricv1.AppStartTask) { t.AppInstanceId = strings.ToUpper(t.AppInstanceId) }, false},
		"no allocation":      {func(t *fabricv1.AppStartTask) { t.AllocationId = "" }, false},
		"relative base path": {func(t *fabricv1.AppStartTask) { t.BasePath = "api/" }, false},
		"base path":          {func(t *fabricv1.AppStartTask) { t.BasePath = "/api/v1/app-proxy/x/" }, true},
		"http without path":  {func(t *fabricv1.AppStartTask) { t.HealthCheck.HttpPath = "" }, false},
		"unknown check":      {func(t *fabricv1.AppStartTask) { t.HealthCheck.Type = "grpc" }, false},
		"tcp check":          {func(t *fabricv1.AppStartTask) { t.HealthCheck = &fabricv1.AppHealthCheck{Type: apptask.HealthTCP} }, true},
		"startup at limit":   {func(t *fabricv1.AppStartTask) { t.StartupTimeout = durationpb.New(apptask.MaxStartupTimeout) }, true},
		"startup past limit": {func(t *fabricv1.AppStartTask) {
			t.StartupTimeout = durationpb.New(apptask.MaxStartupTimeout + time.Nanosecond)
		}, false},
		"negative backoff":  {func(t *fabricv1.AppStartTask) { t.BackoffMin = durationpb.New(-time.Second) }, false},
		"max restarts":      {func(t *fabricv1.AppStartTask) { t.MaxRestarts = apptask.MaxRestarts }, true},
		"too many restarts": {func(t *fabricv1.AppStartTask) { t.MaxRestarts = apptask.MaxRestarts + 1 }, false},
		"slug at limit":     {func(t *fabricv1.AppStartTask) { t.AppSlug = strings.Repeat("a", apptask.MaxSlugBytes) }, true},
		"slug past limit":   {func(t *fabricv1.AppStartTask) { t.AppSlug = strings.Repeat("a", apptask.MaxSlugBytes+1) }, false},
		"interval 300s":     {func(t *fabricv1.AppStartTask) { t.HealthCheck.Interval = durationpb.New(apptask.MaxHealthInterval) }, true},
		"interval past 300s": {func(t *fabricv1.AppStartTask) {
			t.HealthCheck.Interval = durationpb.New(apptask.MaxHealthInterval + time.Second)
		}, false},
		"timeout 60s": {func(t *fabricv1.AppStartTask) { t.HealthCheck.Timeout = durationpb.New(apptask.MaxHealthTimeout) }, true},
		"timeout past 60s": {func(t *fabricv1.AppStartTask) {
			t.HealthCheck.Timeout = durationpb.New(apptask.MaxHealthTimeout + time.Second)
		}, false},
		"threshold 100": {func(t *fabricv1.AppStartTask) { t.HealthCheck.FailureThreshold = 100 }, true},
		"threshold 101": {func(t *fabricv1.AppStartTask) { t.HealthCheck.FailureThreshold = 101 }, false},
	} {
		s := valid()
		c.mut(s)
		if err := apptask.ValidateStart(s); (err == nil) != c.ok {
			t.Errorf("%s: err = %v, want ok %v", name, err, c.ok)
		}
	}
}

func TestDecodeRoundTripAndStop(t *testing.T) {
	b, err := apptask.Encode(valid())
	if err != nil {
		t.Fatal(err)
	}
	got, err := apptask.DecodeStart(b)
	if err != nil || got.GetCommand()[2] != "--port={port}" {
		t.Fatalf("%v %v", got, err)
	}
	if _, err := apptask.DecodeStart([]byte{0xff}); err == nil {
		t.Fatal("garbage decoded")
	}
	stop := &fabricv1.AppStopTask{AppInstanceId: valid().AppInstanceId, Grace: durationpb.New(apptask.MaxGrace)}
	if err := apptask.ValidateStop(stop); err != nil {
		t.Fatal(err)
	}
	stop.Grace = durationpb.New(apptask.MaxGrace + time.Second)
	if err := apptask.ValidateStop(stop); err == nil {
		t.Fatal("grace past the limit accepted")
	}
	if apptask.Live(apptask.StateStopped) || !apptask.Terminal(apptask.StateFailed) || !apptask.Live(apptask.StateUnhealthy) {
		t.Fatal("state predicates")
	}
}

// Artifacts of a start: names are safe directory names and distinct, paths cannot leave
// their artifact's directory, digests are well formed, and the counts are bounded.
func TestValidateStartArtifacts(t *testing.T) {
	base := func() *fabricv1.AppStartTask {
		return &fabricv1.AppStartTask{AppInstanceId: "0192a0a0-0000-7000-8000-000000000001", AllocationId: "0192a0a0-0000-7000-8000-000000000002",
			Command: []string{"app"}, Artifacts: []*fabricv1.AppArtifactMount{{ArtifactId: "0192a0a0-0000-7000-8000-000000000003", Name: "weights",
				Files: []*fabricv1.AppArtifactFile{{Path: "a/b.bin", SizeBytes: 3, Sha256: strings.Repeat("ab", 32)}}}}}
	}
	if err := apptask.ValidateStart(base()); err != nil {
		t.Fatalf("valid: %v", err)
	}
	for name, edit := range map[string]func(t *fabricv1.AppStartTask){
		"dot-dot path":    func(t *fabricv1.AppStartTask) { t.Artifacts[0].Files[0].Path = "../x" },
		"absolute path":   func(t *fabricv1.AppStartTask) { t.Artifacts[0].Files[0].Path = "/etc/passwd" },
		"empty element":   func(t *fabricv1.AppStartTask) { t.Artifacts[0].Files[0].Path = "a//b" },
		"name with slash": func(t *fabricv1.AppStartTask) { t.Artifacts[0].Name = "a/b" },
		"name dot-dot":    func(t *fabricv1.AppStartTask) { t.Artifacts[0].Name = ".." },
		"bad digest":      func(t *fabricv1.AppStartTask) { t.Artifacts[0].Files[0].Sha256 = strings.Repeat("AB", 32) },
		"negative size":   func(t *fabricv1.AppStartTask) { t.Artifacts[0].Files[0].SizeBytes = -1 },
		"duplicate name":  func(t *fabricv1.AppStartTask) { t.Artifacts = append(t.Artifacts, t.Artifacts[0]) },
		"file is also dir": func(t *fabricv1.AppStartTask) {
			t.Artifacts[0].Files = append(t.Artifacts[0].Files, &fabricv1.AppArtifactFile{Path: "a", Sha256: strings.Repeat("ab", 32)})
		},
		"17 artifacts": func(t *fabricv1.AppStartTask) {
			for i := 0; i < 16; i++ {
				t.Artifacts = append(t.Artifacts, &fabricv1.AppArtifactMount{ArtifactId: t.Artifacts[0].ArtifactId, Name: "n" + strings.Repeat("x", i)})
			}
		},
	} {
		task := base()
		edit(task)
		if err := apptask.ValidateStart(task); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
