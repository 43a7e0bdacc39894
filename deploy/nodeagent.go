package deploy

import _ "embed"

// NodeAgentUnit is systemd/gantry-nodeagent.service, the node agent's unit as
// install-nodeagent.sh installs it (binary in /usr/local/bin). The Debian package
// (deploy/packaging) ships the same unit with the binary in /usr/bin.
//
//go:embed systemd/gantry-nodeagent.service
var NodeAgentUnit []byte
