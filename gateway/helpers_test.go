package gateway_test

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
)

func hexSum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }
