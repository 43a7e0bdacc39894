#!/usr/bin/env bash
# Generates proto/gen/fabric/v1 from proto/fabric/v1/*.proto (protobuf + gRPC).
# Called by `make generate`; deliberately not a go:generate directive, so that
# `go generate ./proto/...` does not need protoc. Needs protoc (Debian:
# protobuf-compiler); the two plugins are built at pinned versions into a cache
# directory, so the output is the same on every machine with the same protoc.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${GANTRY_PROTOC_PLUGINS:-${XDG_CACHE_HOME:-$HOME/.cache}/gantry/protoc-plugins}"

command -v protoc >/dev/null || { echo "generate.sh: protoc not found (apt-get install -y protobuf-compiler)" >&2; exit 1; }

# Two separate installs: the modules pin different protobuf versions.
if [ ! -x "$bin/protoc-gen-go-v1.36.12" ]; then
	mkdir -p "$bin"
	GOWORK=off GOFLAGS= GOBIN="$bin" go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
	mv "$bin/protoc-gen-go" "$bin/protoc-gen-go-v1.36.12"
fi
if [ ! -x "$bin/protoc-gen-go-grpc-v1.6.2" ]; then
	mkdir -p "$bin"
	GOWORK=off GOFLAGS= GOBIN="$bin" go install google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.2
	mv "$bin/protoc-gen-go-grpc" "$bin/protoc-gen-go-grpc-v1.6.2"
fi

out="$root/proto/gen"
rm -f "$out"/fabric/v1/*.pb.go
mkdir -p "$out"
cd "$root/proto"
protoc \
	--plugin=protoc-gen-go="$bin/protoc-gen-go-v1.36.12" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc-v1.6.2" \
	-I . \
	--go_out="$out" --go_opt=module=github.com/gantry-gpu/gantry/proto/gen \
	--go-grpc_out="$out" --go-grpc_opt=module=github.com/gantry-gpu/gantry/proto/gen \
	fabric/v1/*.proto
