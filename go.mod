module github.com/vmgate/vmgate

go 1.26.0

require (
	github.com/creack/pty v1.1.24 // indirect
	golang.org/x/crypto v0.59.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
	golang.org/x/term v0.48.0 // indirect
)
