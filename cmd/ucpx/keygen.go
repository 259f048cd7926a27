package main

import (
	"fmt"
	"io"

	"github.com/ucpx/ucpx/ucp"
)

// runKeygen writes a new auth key file (hex, mode 0600) for UCPX_AUTH_KEY_FILE.
func runKeygen(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("keygen", "[-o FILE]", stderr)
	out := fs.String("o", "ucpx.key", "key `file` to create (refuses to overwrite)")
	if st, ok := parseFlags(fs, args); !ok {
		return st // a stray argument (a path without -o) must not leave the key elsewhere
	}
	key, err := ucp.GenerateAuthKey()
	if err == nil {
		err = ucp.WriteAuthKeyFile(*out, key)
	}
	if err != nil {
		fmt.Fprintln(stderr, "ucpx keygen:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (%d-byte key); every process of the job: export %s=%s\n", *out, len(key), ucp.AuthKeyFileEnv, *out)
	return 0
}
