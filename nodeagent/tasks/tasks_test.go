package tasks

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

func TestOnceRunsEachIDOnce(t *testing.T) {
	var runs atomic.Int32
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result {
		runs.Add(1)
		return Result{Status: Succeeded, Output: []byte("out-" + t.ID)}
	}), 0)
	ctx := context.Background()
	first := o.Execute(ctx, Task{ID: "t1", Kind: "k"})
	again := o.Execute(ctx, Task{ID: "t1", Kind: "k"})
	if runs.Load() != 1 || string(first.Output) != "out-t1" || string(again.Output) != "out-t1" {
		t.Fatalf("runs=%d first=%+v again=%+v", runs.Load(), first, again)
	}
	o.Execute(ctx, Task{ID: "t2", Kind: "k"})
	if runs.Load() != 2 || o.Executions() != 2 {
		t.Fatalf("runs=%d executions=%d", runs.Load(), o.Executions())
	}
}

func TestOnceConcurrentRedeliveryWaitsForFirstRun(t *testing.T) {
	release := make(chan struct{})
	var runs atomic.Int32
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result {
		runs.Add(1)
		<-release
		return Result{Status: Succeeded}
	}), 0)
	var wg sync.WaitGroup
	results := make([]Result, 10)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = o.Execute(context.Background(), Task{ID: "same", Kind: "k"})
		}()
	}
	close(release)
	wg.Wait()
	if runs.Load() != 1 {
		t.Fatalf("ran %d times", runs.Load())
	}
	for i, r := range results {
		if r.Status != Succeeded {
			t.Fatalf("result %d = %+v", i, r)
		}
	}
}

func TestOnceFailedResultIsRemembered(t *testing.T) {
	var runs atomic.Int32
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result {
		runs.Add(1)
		return Fail("gpu_unavailable", fmt.Errorf("no"))
	}), 0)
	o.Execute(context.Background(), Task{ID: "x"})
	r := o.Execute(context.Background(), Task{ID: "x"})
	if runs.Load() != 1 || r.Status != Failed || r.ErrorCode != "gpu_unavailable" {
		t.Fatalf("runs=%d r=%+v", runs.Load(), r)
	}
}

func TestOnceCancelledRunIsNotRemembered(t *testing.T) {
	var runs atomic.Int32
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result {
		runs.Add(1)
		if ctx.Err() != nil {
			return Fail(CodeCancelled, ctx.Err())
		}
		return Result{Status: Succeeded}
	}), 0)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if r := o.Execute(ctx, Task{ID: "x"}); r.Status != Failed {
		t.Fatalf("cancelled run = %+v", r)
	}
	if r := o.Execute(context.Background(), Task{ID: "x"}); r.Status != Succeeded || runs.Load() != 2 {
		t.Fatalf("rerun after cancel = %+v, runs=%d", r, runs.Load())
	}
}

func TestOnceForgetsOldestBeyondBound(t *testing.T) {
	var runs atomic.Int32
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result {
		runs.Add(1)
		return Result{Status: Succeeded}
	}), 3)
	ctx := context.Background()
	for _, id := range []string{"a", "b", "c", "d"} { // "a" falls out
		o.Execute(ctx, Task{ID: id})
	}
	for _, id := range []string{"b", "c", "d"} {
		o.Execute(ctx, Task{ID: id})
	}
	if runs.Load() != 4 {
		t.Fatalf("remembered ids re-ran: runs=%d", runs.Load())
	}
	o.Execute(ctx, Task{ID: "a"})
	if runs.Load() != 5 {
		t.Fatalf("forgotten id not re-run: runs=%d", runs.Load())
	}
	if len(o.done) != 3 {
		t.Fatalf("remembering %d ids, bound 3", len(o.done))
	}
}

func TestOncePanicBecomesFailure(t *testing.T) {
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result { panic("boom") }), 0)
	r := o.Execute(context.Background(), Task{ID: "p"})
	if r.Status != Failed || r.ErrorCode != CodePanic {
		t.Fatalf("r = %+v", r)
	}
}

func TestMuxRoutesByKind(t *testing.T) {
	m := NewMux()
	m.Handle("b.kind", ExecutorFunc(func(ctx context.Context, t Task) Result { return Result{Status: Succeeded, Output: []byte("b")} }))
	m.Handle("a.kind", ExecutorFunc(func(ctx context.Context, t Task) Result { return Result{Status: Succeeded, Output: []byte("a")} }))
	if got := m.Kinds(); len(got) != 2 || got[0] != "a.kind" || got[1] != "b.kind" {
		t.Fatalf("kinds = %v", got)
	}
	if r := m.Execute(context.Background(), Task{ID: "1", Kind: "a.kind"}); string(r.Output) != "a" {
		t.Fatalf("r = %+v", r)
	}
	r := m.Execute(context.Background(), Task{ID: "2", Kind: "nope"})
	if r.Status != Failed || r.ErrorCode != CodeUnsupportedKind {
		t.Fatalf("unknown kind = %+v", r)
	}
}

func TestOnceLookup(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{})
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result {
		close(started)
		<-release
		return Result{Status: Succeeded, Output: []byte("ok")}
	}), 0)
	if s, _ := o.Lookup("t"); s != Unknown {
		t.Fatalf("state %v", s)
	}
	done := make(chan struct{})
	go func() { o.Execute(context.Background(), Task{ID: "t"}); close(done) }()
	<-started
	if s, _ := o.Lookup("t"); s != Running {
		t.Fatalf("state %v", s)
	}
	if a := o.Active(); len(a) != 1 || a[0] != "t" {
		t.Fatalf("active %v", a)
	}
	close(release)
	<-done
	if s, r := o.Lookup("t"); s != Finished || string(r.Output) != "ok" {
		t.Fatalf("state %v %+v", s, r)
	}
	if a := o.Active(); len(a) != 0 {
		t.Fatalf("active %v", a)
	}
}

func TestOnceGoRegistersBeforeReturning(t *testing.T) {
	release := make(chan struct{})
	var runs atomic.Int32
	o := NewOnce(ExecutorFunc(func(ctx context.Context, t Task) Result {
		runs.Add(1)
		<-release
		return Result{Status: Succeeded}
	}), 0)
	got := make(chan Result, 2)
	if !o.Go(context.Background(), Task{ID: "g"}, func(r Result, ok bool) { got <- r }) {
		t.Fatal("first Go refused")
	}
	if o.Go(context.Background(), Task{ID: "g"}, func(Result, bool) { t.Error("duplicate ran") }) {
		t.Fatal("duplicate Go started")
	}
	// Execute of the same id while running waits for the first run's result.
	waited := make(chan Result, 1)
	go func() { waited <- o.Execute(context.Background(), Task{ID: "g"}) }()
	close(release)
	if r := <-got; r.Status != Succeeded {
		t.Fatalf("r = %+v", r)
	}
	if r := <-waited; r.Status != Succeeded {
		t.Fatalf("waited = %+v", r)
	}
	if o.Go(context.Background(), Task{ID: "g"}, func(Result, bool) { t.Error("finished id ran again") }) {
		t.Fatal("finished id started again")
	}
	if runs.Load() != 1 {
		t.Fatalf("runs = %d", runs.Load())
	}
}
