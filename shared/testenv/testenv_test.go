package testenv

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMain(m *testing.M) { Main(m) }

var widgets = Template{
	Name:    "testenv_widgets",
	Version: "v1",
	Migrate: func(ctx context.Context, url string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, `CREATE TABLE widgets (id int PRIMARY KEY, name text NOT NULL)`)
		return err
	},
}

func TestNewDatabaseIsolated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	a := NewDatabase(t, widgets)
	b := NewDatabase(t, widgets)

	if _, err := a.Exec(ctx, `INSERT INTO widgets VALUES (1, 'only in a')`); err != nil {
		t.Fatal(err)
	}
	count := func(p *pgxpool.Pool) (n int) {
		t.Helper()
		if err := p.QueryRow(ctx, `SELECT count(*) FROM widgets`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got := count(a); got != 1 {
		t.Errorf("a has %d widgets, want 1", got)
	}
	if got := count(b); got != 0 {
		t.Errorf("b has %d widgets, want 0 (databases not isolated)", got)
	}

	var nameA, nameB string
	_ = a.QueryRow(ctx, `SELECT current_database()`).Scan(&nameA)
	_ = b.QueryRow(ctx, `SELECT current_database()`).Scan(&nameB)
	if nameA == nameB {
		t.Errorf("both pools on database %s", nameA)
	}
}

func TestNewDatabaseParallelMigratesOnce(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	tmpl := widgets
	tmpl.Version = "parallel_" + Namespace(t) // a fresh template for this run
	tmpl.Migrate = func(ctx context.Context, url string) error {
		calls.Add(1)
		return widgets.Migrate(ctx, url)
	}
	t.Cleanup(func() {
		if n := calls.Load(); n != 1 {
			t.Errorf("migrate ran %d times for 4 databases, want 1", n)
		}
		dropTemplate(t, tmpl)
	})
	for i := 0; i < 4; i++ {
		t.Run("db", func(t *testing.T) {
			t.Parallel()
			p := NewDatabase(t, tmpl)
			if _, err := p.Exec(context.Background(), `INSERT INTO widgets VALUES (1, 'x')`); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// dropTemplate removes a per-run template so the shared server stays tidy.
func dropTemplate(t *testing.T, tmpl Template) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, PostgresURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := templateName(tmpl)
	if _, err := conn.Exec(ctx, `ALTER DATABASE `+ident(name)+` WITH IS_TEMPLATE false`); err != nil {
		t.Error(err)
	}
	if _, err := conn.Exec(ctx, `DROP DATABASE `+ident(name)+` WITH (FORCE)`); err != nil {
		t.Error(err)
	}
}

func TestDatabaseDroppedAtCleanup(t *testing.T) {
	t.Parallel()
	var url string
	t.Run("inner", func(t *testing.T) { url = DatabaseURL(t, widgets) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		conn.Close(ctx)
		t.Fatalf("database at %s still exists after its test ended", url)
	}
}

func TestTemplateName(t *testing.T) {
	got := templateName(Template{Name: "Control-Plane", Version: "ab12"})
	if got != "tmpl_control_plane_ab12" {
		t.Errorf("templateName = %q", got)
	}
	long := templateName(Template{Name: "x", Version: string(make([]byte, 100))})
	if len(long) > 63 {
		t.Errorf("templateName not cut to 63 bytes: %d", len(long))
	}
	v1, _ := VersionOf(fstest.MapFS{"00001_a.sql": {Data: []byte("CREATE TABLE a()")}})
	v2, _ := VersionOf(fstest.MapFS{"00001_a.sql": {Data: []byte("CREATE TABLE b()")}})
	if len(v1) != 12 || v1 == v2 {
		t.Errorf("VersionOf: %q, %q", v1, v2)
	}
}

func TestNATSJetStream(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ns := Namespace(t)
	stream := "TESTENV_" + ns
	CleanupStreams(t, js, stream)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{"testenv." + ns + ".>"}}); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, "testenv."+ns+".hello", []byte("hi"))
	if err != nil {
		t.Fatal(err)
	}
	if ack.Stream != stream || ack.Sequence != 1 {
		t.Errorf("ack = %+v", ack)
	}
	bucket := "testenv_" + ns
	CleanupKV(t, js, bucket)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

func TestNATSCleanupStreamsDeletes(t *testing.T) {
	t.Parallel()
	nc, err := nats.Connect(NATS(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	stream := "TESTENV_" + Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	t.Run("inner", func(t *testing.T) {
		CleanupStreams(t, js, stream, "TESTENV_NEVER_CREATED_"+Namespace(t))
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{stream}}); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := js.Stream(ctx, stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("stream after cleanup: err = %v, want ErrStreamNotFound", err)
	}
}

func TestNamespaceUnique(t *testing.T) {
	a, b := Namespace(t), Namespace(t)
	if len(a) != 8 || a == b {
		t.Errorf("Namespace: %q, %q", a, b)
	}
}

func TestRedisAddr(t *testing.T) {
	t.Parallel()
	if a := RedisAddr(t); !redisAnswers(a) {
		t.Errorf("RedisAddr %s does not answer", a)
	}
}

func TestStartRedisStop(t *testing.T) {
	t.Parallel()
	r := StartRedis(t)
	if !redisAnswers(r.Addr()) {
		t.Fatalf("private redis at %s does not answer", r.Addr())
	}
	if r.Addr() == localRedis {
		t.Fatalf("StartRedis returned the machine's Redis")
	}
	r.Stop()
	if c, err := net.DialTimeout("tcp", r.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatalf("redis at %s still accepts connections after Stop", r.Addr())
	}
	if _, err := os.Stat(r.dir); !os.IsNotExist(err) {
		t.Errorf("redis dir %s left behind", r.dir)
	}
	r.Stop() // idempotent
}
