module github.com/gantry-gpu/gantry/deploy

go 1.26.0
