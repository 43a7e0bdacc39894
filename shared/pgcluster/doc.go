// Package pgcluster owns throwaway PostgreSQL clusters and the probing of
// existing servers.
//
// Start creates (on first use) and runs a private cluster from the machine's
// PostgreSQL binaries (/usr/lib/postgresql/<ver>/bin, newest version first):
// trust authentication, listening only on 127.0.0.1, no Unix socket, durability
// settings relaxed for speed. PostgreSQL refuses to run as root, so when the
// caller is root the cluster directory is chowned to the "postgres" OS user and
// initdb/postgres run under that user with LC_ALL=C.UTF-8. Every directory
// above the cluster directory must then be searchable by that user.
//
// Discover and Ping answer "is there a usable server at this URL?" quickly;
// make dev and shared/testenv use them to prefer an existing server
// (DATABASE_URL, else 127.0.0.1:5432) before starting a throwaway one.
package pgcluster
