module github.com/gantry-gpu/gantry/loggateway

go 1.26
