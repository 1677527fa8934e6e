package vmexec

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmgate/vmgate/gateway/client"
	"github.com/vmgate/vmgate/gateway/wire"
)

// keepReceipt writes the receipt of an exec (res, err as client.Exec
// returned them) to path: the result's, or that of a refusal or failure
// (a denial's too). The client has checked it against what it received;
// a receipt it refused is never written, and ends vm-exec with
// ExitInternal (done) although the command ran. A request refused before
// its decision was recorded has none: vm-exec says so.
func keepReceipt(path string, res *wire.Result, err error) (code int, done bool) {
	var re *client.ReceiptError
	if errors.As(err, &re) {
		if res != nil && err == error(re) {
			fmt.Fprintf(os.Stderr, "vm-exec: %v; nothing written to %s\n", re, path)
			return wire.ExitInternal, true
		}
		return 0, false // reported with the refusal or failure it came with
	}
	doc := client.ReceiptOf(err)
	if err == nil {
		doc = res.Receipt
	}
	if len(doc) == 0 {
		fmt.Fprintf(os.Stderr, "vm-exec: no receipt: the request ended before its decision was recorded\n")
		return 0, false
	}
	if werr := writeAtomic(path, append(append([]byte(nil), doc...), '\n')); werr != nil {
		fmt.Fprintf(os.Stderr, "vm-exec: receipt: %v\n", werr)
		return wire.ExitInternal, true
	}
	return 0, false
}

// writeAtomic writes data to path (mode 0600: a receipt holds the command
// line unredacted) through a temporary file beside it.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
