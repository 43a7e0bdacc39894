package e2e_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// patternReader yields n bytes of a fixed pattern, so 1 GiB never sits in memory.
type patternReader struct{ left int64 }

func (p *patternReader) Read(b []byte) (int, error) {
	if p.left <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(b)), p.left)
	for i := range b[:n] {
		b[i] = byte('a' + (p.left-int64(i))%26)
	}
	p.left -= n
	return int(n), nil
}

func transportName() string {
	if t := os.Getenv("GANTRY_BENCH_FABRIC_TRANSPORT"); t != "" {
		return t
	}
	return "auto"
}

// BenchmarkStorageAttachmentRead is issue 20's attachment benchmark (`make bench`): one
// 1 GiB object read inside a real allocation through a ro attachment (`cat file >
// /dev/null` in a shell of the allocation, timed there) against an API GET of the same
// object in the same run, on the same control plane. The method is the agent's auto
// choice (FUSE where /dev/fuse works, else copy-in, whose attach then carries the
// transfer: its time from POST to attached is reported too). It prints the throughputs
// and their ratio (goal: attachment >= 0.5x the API); nothing is asserted on timing.
//
// GANTRY_BENCH_STORAGE_BYTES shrinks the object while iterating;
// GANTRY_BENCH_ATTACH_CPUPROFILE=<file> profiles this process (control plane and agent
// both run in it) while the allocation reads the file.
func BenchmarkStorageAttachmentRead(b *testing.B) {
	size := int64(1 << 30)
	if v, err := strconv.ParseInt(os.Getenv("GANTRY_BENCH_STORAGE_BYTES"), 10, 64); err == nil && v > 0 {
		size = v
	}
	for i := 0; i < b.N; i++ {
		benchAttachmentRead(b, size)
	}
}

func benchAttachmentRead(b *testing.B, size int64) {
	mode := "fuse"
	if ok, why := fuseUsable(); !ok {
		b.Logf("%s: copy mode", why)
		mode = "copy"
	}
	if m := os.Getenv("GANTRY_BENCH_STORAGE_MODE"); m == "fuse" || m == "copy" {
		mode = m // copy: the attach itself carries the transfer (one Read stream per object)
	}
	// The agent's fabric transport: auto (QUIC) unless GANTRY_BENCH_FABRIC_TRANSPORT says.
	w := newStorageWorld(b, mode, os.Getenv("GANTRY_BENCH_FABRIC_TRANSPORT"))
	w.shellLimit = 10 * time.Minute

	req, _ := http.NewRequest(http.MethodPut, w.c.url+"/api/v1/storage/buckets/data/object?path="+url.QueryEscape("big.bin"), &patternReader{left: size})
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("X-Project-ID", w.project.String())
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 201 && res.StatusCode != 200 {
		b.Fatalf("put 1 GiB: %d %s", res.StatusCode, body)
	}

	start := time.Now()
	a := w.attach(b, "ro", "")
	w.waitState(b, a.AttachmentID, "attached")
	attachTime := time.Since(start)

	// Attachment: timed inside the allocation, so the terminal stream's setup is not in it.
	stopProfile := startCPUProfile(b, os.Getenv("GANTRY_BENCH_ATTACH_CPUPROFILE"))
	cpu0 := processCPU()
	out, code := w.shell(b, `s=$(date +%s%N); cat "$HOME/buckets/data/big.bin" > /dev/null || exit 7; e=$(date +%s%N); echo "ns=$((e-s))"`)
	var ns int64
	if i := strings.Index(out, "ns="); code != 0 || i < 0 {
		b.Fatalf("reading through the attachment: exit %d %q", code, out)
	} else if _, err := fmt.Sscanf(out[i:], "ns=%d", &ns); err != nil || ns <= 0 {
		b.Fatalf("reading through the attachment: %q", out)
	}
	attachCPU := processCPU() - cpu0
	stopProfile()
	attachRead := time.Duration(ns)

	// API GET of the same object, same run.
	cpu0 = processCPU()
	start = time.Now()
	req, _ = http.NewRequest(http.MethodGet, w.c.url+"/api/v1/storage/buckets/data/object?path=big.bin", nil)
	req.Header.Set("Authorization", "Bearer "+w.token)
	req.Header.Set("X-Project-ID", w.project.String())
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, res.Body)
	res.Body.Close()
	apiRead := time.Since(start)
	apiCPU := processCPU() - cpu0
	if err != nil || n != size {
		b.Fatalf("API GET read %d bytes: %v", n, err)
	}
	mib := float64(size) / (1 << 20)
	attachRate, apiRate := mib/attachRead.Seconds(), mib/apiRead.Seconds()
	fmt.Printf("storage attachment (%s, fabric %s): read %d MiB in %s (%.0f MiB/s) vs API GET %s (%.0f MiB/s): ratio %.2fx (goal >= 0.5x); attach took %s\n",
		mode, transportName(), size>>20, attachRead.Round(time.Millisecond), attachRate, apiRead.Round(time.Millisecond), apiRate, attachRate/apiRate, attachTime.Round(time.Millisecond))
	// What each path costs, whatever else the machine runs: CPU seconds per GiB of this
	// process (control plane, agent and the GET's client; the allocation's cat is a
	// child process and not counted), with the load average beside it.
	gib := float64(size) / (1 << 30)
	fmt.Printf("  CPU of this process per GiB: attachment %.2f s, API GET %.2f s (load average %s)\n",
		attachCPU.Seconds()/gib, apiCPU.Seconds()/gib, loadAverage())
	b.ReportMetric(attachRate/apiRate, "ratio")
}

// processCPU is this process's user + system CPU so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func loadAverage() string {
	raw, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(raw)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], " ")
	}
	return "unknown"
}

// startCPUProfile profiles this process into path until the returned func runs (a
// no-op without a path).
func startCPUProfile(b *testing.B, path string) func() {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatal(err)
	}
	return func() { pprof.StopCPUProfile(); _ = f.Close() }
}
