package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/spf13/pflag"

	"github.com/vmgate/vmgate/gateway/e2bfront"
	"github.com/vmgate/vmgate/internal/durable"
	"github.com/vmgate/vmgate/policy"
)

const e2bKeyAddLong = `Makes a new API key (e2b_ and 256 random bits in hex), adds its line to the keys file
(created with mode 0600 when missing) and prints the key once: it is not shown again.
With --config, the profile is checked against that policy first (it must exist and have
match.e2b = true or match.any = true). Send vmgated SIGHUP (systemctl reload vmgated) for
a running daemon to read the file again.`

func e2bKeyAdd(fs *pflag.FlagSet) runFunc {
	profile := fs.String("profile", "", "the policy profile the key gets (required)")
	keys := fs.String("keys", DefaultE2BKeys, "the E2B keys file")
	comment := fs.String("comment", "", "who holds the key (logged with its fingerprint)")
	config := fs.String("config", "", "policy file to check the profile against")
	return func(_ context.Context, _ []string) error {
		if *profile == "" {
			return fmt.Errorf("%w: --profile is required", errUsage)
		}
		if *config != "" {
			pol, err := policy.Load(*config)
			if err != nil {
				return err
			}
			if err := pol.CheckDoorKeyProfile(policy.DoorE2B, *profile); err != nil {
				return err
			}
		}
		key := e2bfront.NewKey()
		line := e2bfront.FormatLine(*profile, key, *comment)
		if err := appendKey(*keys, line); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "added a key for profile %s to %s (fingerprint %s)\n", *profile, *keys, e2bfront.Fingerprint(key))
		fmt.Println(key)
		return nil
	}
}

// appendKey adds line to the keys file, which must parse before and after.
func appendKey(path, line string) error {
	old, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		old = nil
	case err != nil:
		return fmt.Errorf("e2b keys: %w", err)
	default:
		if _, err := e2bfront.LoadKeys(path); err != nil {
			return err
		}
	}
	if len(old) > 0 && old[len(old)-1] != '\n' {
		old = append(old, '\n')
	}
	data := append(old, []byte(line)...)
	if _, err := e2bfront.ParseKeys(path, data); err != nil {
		return err
	}
	return durable.WriteFile(path, data, 0o600)
}
