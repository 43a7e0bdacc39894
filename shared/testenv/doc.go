// Package testenv owns the real services that tests use: PostgreSQL, NATS
// with JetStream and Redis.
//
// Each service is found in the same order: the environment variable when set
// (TEST_DATABASE_URL, NATS_URL, REDIS_URL; an unreachable one is a failure),
// else the machine's server on its default 127.0.0.1 port when it answers,
// else a throwaway instance started once per test process (a PostgreSQL
// cluster from the machine's binaries, an embedded nats-server, a
// redis-server child). When none of these works the test is skipped, except
// under CI=true, where it fails with the reason: nothing skips silently in CI.
//
// Packages that use testenv call it from TestMain so throwaway instances are
// stopped and their directories removed when the tests end:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// PostgreSQL tests get a private database per call, cloned from a template
// that is migrated once (see NewDatabase), so tests and test packages can run
// in parallel and leave nothing behind. NATS tests name their streams and KV
// buckets with Namespace and delete them with CleanupStreams / CleanupKV.
package testenv
