module github.com/distbuf/distbuf

go 1.26.0

require (
	github.com/NVIDIA/go-nvml v0.12.9-0
	github.com/stretchr/testify v1.12.1
	golang.org/x/sync v0.25.0
	gonum.org/v1/gonum v0.17.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
