package netproc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/vmgate/vmgate/policy/netrule"
	"github.com/vmgate/vmgate/vm/netstack"
)

// MaxMessage bounds one message on the channel, in either direction.
const MaxMessage = 64 << 10

// toChild is a message from the daemon: the start (Hosts), then policies,
// and dials into the guest (Dial, with no Gen or Policy).
type toChild struct {
	// Hosts pins guest DNS names to addresses (vmgated serve
	// --net-hosts); only in the first message.
	Hosts map[string][]netip.Addr `json:"hosts,omitempty"`
	// Gen numbers the policy; records name the policy they were made under.
	Gen    uint64      `json:"gen"`
	Policy *wireEgress `json:"policy,omitempty"`
	// Dial asks for a connection into the guest (a published port). The
	// message carries the netstack's end of a socket pair as its one fd:
	// the netstack writes one dial status byte on it, and on dialOK relays
	// it to the guest's connection until either side ends.
	Dial *wireDial `json:"dial,omitempty"`
}

// wireDial is a dial into the guest.
type wireDial struct {
	Port uint16 `json:"port"`
}

// Dial status: the first byte the netstack writes on a dial's socket
// pair. Any other byte is a netstack that misbehaves.
const (
	dialOK          byte = 0 // connected: the relay begins
	dialRefused     byte = 1 // the guest reset the connection: nothing listens
	dialUnreachable byte = 2 // the guest did not answer in time
	dialBusy        byte = 3 // the netstack carries maxDials connections already
	dialFailed      byte = 4 // another failure (the network is closing)
)

// wireEgress is netrule.Egress as sent: rules as their text, parsed again
// on the other side.
type wireEgress struct {
	Rules       []string       `json:"rules"`
	Ranges      []netip.Prefix `json:"ranges,omitempty"`
	MaxConns    int            `json:"max_conns"`
	MaxBytes    int64          `json:"max_bytes"`
	ConnectRate int            `json:"connect_rate"`
	// Secrets are the VM's secrets, values included (the netstack puts
	// them in; it is outside the guest); CA is its session's CA, cert
	// and key, which intercepted TLS to the secrets' hosts is served
	// with.
	Secrets []wireSecret `json:"secrets,omitempty"`
	CA      *wireCA      `json:"ca,omitempty"`
}

// wireSecret is a netstack.Secret as sent: its hosts as their text.
type wireSecret struct {
	Name        string   `json:"name"`
	Placeholder string   `json:"placeholder"`
	Value       string   `json:"value,omitempty"`
	Hosts       []string `json:"hosts,omitempty"`
	Headers     []string `json:"headers,omitempty"`
	Query       bool     `json:"query,omitempty"`
}

// wireCA is a session CA as sent (PEM).
type wireCA struct {
	Cert []byte `json:"cert"`
	Key  []byte `json:"key"`
}

func egressToWire(pol netstack.Policy) *wireEgress {
	e := pol.Egress
	w := &wireEgress{Ranges: e.AllowedRanges, MaxConns: e.MaxConns, MaxBytes: e.MaxBytes, ConnectRate: e.ConnectRate}
	for _, r := range e.Rules {
		w.Rules = append(w.Rules, r.Text)
	}
	for _, s := range pol.Secrets {
		ws := wireSecret{Name: s.Name, Placeholder: s.Placeholder, Value: s.Value, Headers: s.Headers, Query: s.Query}
		for _, h := range s.Hosts {
			ws.Hosts = append(ws.Hosts, h.Text)
		}
		w.Secrets = append(w.Secrets, ws)
	}
	if pol.CA != nil {
		w.CA = &wireCA{Cert: pol.CA.CertPEM, Key: pol.CA.KeyPEM}
	}
	return w
}

// secrets are the policy's secrets as the netstack applies them.
func (w *wireEgress) secrets() ([]netstack.Secret, error) {
	var out []netstack.Secret
	for _, ws := range w.Secrets {
		if ws.Name == "" || len(ws.Placeholder) < 16 {
			return nil, fmt.Errorf("netstack message: secret %q without a placeholder", ws.Name)
		}
		hosts, err := netrule.ParseRules(ws.Hosts)
		if err != nil {
			return nil, fmt.Errorf("netstack message: secret %q: %w", ws.Name, err)
		}
		s := netstack.Secret{Hosts: hosts}
		s.Name, s.Placeholder, s.Value, s.Headers, s.Query = ws.Name, ws.Placeholder, ws.Value, ws.Headers, ws.Query
		out = append(out, s)
	}
	return out, nil
}

func (w *wireEgress) egress() (netrule.Egress, error) {
	rules, err := netrule.ParseRules(w.Rules)
	if err != nil {
		return netrule.Egress{}, err
	}
	return netrule.Egress{Rules: rules, AllowedRanges: w.Ranges, MaxConns: w.MaxConns, MaxBytes: w.MaxBytes, ConnectRate: w.ConnectRate}, nil
}

// fromChild is a message from the netstack: one record, made under the
// policy numbered Gen; or that the policy numbered Gen is in force
// (Applied); or, as its last message, why it ends (End).
type fromChild struct {
	Gen     uint64      `json:"gen"`
	Record  *wireRecord `json:"record,omitempty"`
	Applied bool        `json:"applied,omitempty"`
	End     string      `json:"end,omitempty"`
}

// endQEMU is the netstack's last message when QEMU's connection ended: it
// exits, as there is no guest left to serve.
const endQEMU = "qemu"

// message is a message from the netstack as the daemon read it: a record,
// a policy in force (applied), or the end.
type message struct {
	gen     uint64
	record  netstack.Record
	applied bool
	end     string // endQEMU, or empty for a record
}

// wireRecord is netstack.Record as sent.
type wireRecord struct {
	Proto      string     `json:"proto"`
	Name       string     `json:"name,omitempty"`
	Addr       netip.Addr `json:"addr,omitzero"`
	Port       uint16     `json:"port,omitempty"`
	Allowed    bool       `json:"allowed,omitempty"`
	Rule       string     `json:"rule,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	BytesOut   int64      `json:"bytes_out,omitempty"`
	BytesIn    int64      `json:"bytes_in,omitempty"`
	DurationNS int64      `json:"duration_ns,omitempty"`
	// Intercepted, Secret and SecretPlace: secrets.go of vm/netstack.
	Intercepted bool   `json:"intercepted,omitempty"`
	Secret      string `json:"secret,omitempty"`
	SecretPlace string `json:"secret_place,omitempty"`
}

func recordToWire(r netstack.Record) wireRecord {
	return wireRecord{Proto: r.Proto, Name: r.Name, Addr: r.Addr, Port: r.Port, Allowed: r.Allowed, Rule: r.Rule,
		Reason: r.Reason, BytesOut: r.BytesOut, BytesIn: r.BytesIn, DurationNS: int64(r.Duration),
		Intercepted: r.Intercepted, Secret: r.Secret, SecretPlace: r.SecretPlace}
}

// decodeStrict parses one message into v: exactly one JSON object with
// only known fields, at most MaxMessage bytes.
func decodeStrict(b []byte, v any) error {
	if len(b) > MaxMessage {
		return fmt.Errorf("netstack message of %d bytes (max %d)", len(b), MaxMessage)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("netstack message: %w", err)
	}
	if dec.More() {
		return fmt.Errorf("netstack message: data after the object")
	}
	return nil
}

// parseMessage is the daemon's reading of a message from the netstack:
// strict, and only the record kinds a netstack makes, or its end.
func parseMessage(b []byte) (message, error) {
	var m fromChild
	if err := decodeStrict(b, &m); err != nil {
		return message{}, err
	}
	switch {
	case m.Applied && (m.End != "" || m.Record != nil):
		return message{}, fmt.Errorf("netstack message: a policy in force, and a record or an end")
	case m.Applied:
		return message{gen: m.Gen, applied: true}, nil
	case m.End != "" && m.Record != nil:
		return message{}, fmt.Errorf("netstack message: a record and an end")
	case m.End == endQEMU:
		return message{gen: m.Gen, end: m.End}, nil
	case m.End != "":
		return message{}, fmt.Errorf("netstack message: end %q", m.End)
	case m.Record == nil:
		return message{}, fmt.Errorf("netstack message: neither a record nor an end")
	}
	w := *m.Record
	switch w.Proto {
	case "tcp", "udp", "dns":
	default:
		return message{}, fmt.Errorf("netstack record: protocol %q", w.Proto)
	}
	if w.BytesOut < 0 || w.BytesIn < 0 || w.DurationNS < 0 {
		return message{}, fmt.Errorf("netstack record: negative count")
	}
	return message{gen: m.Gen, record: netstack.Record{Proto: w.Proto, Name: w.Name, Addr: w.Addr, Port: w.Port, Allowed: w.Allowed, Rule: w.Rule,
		Reason: w.Reason, BytesOut: w.BytesOut, BytesIn: w.BytesIn, Duration: time.Duration(w.DurationNS),
		Intercepted: w.Intercepted, Secret: w.Secret, SecretPlace: w.SecretPlace}}, nil
}
