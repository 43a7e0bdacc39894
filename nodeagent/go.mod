module github.com/gantry-gpu/gantry/nodeagent

go 1.26
