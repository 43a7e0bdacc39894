package server_test

import "github.com/gantry-gpu/gantry/controlplane/internal/app"

type appConfig = app.Config
