package client

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/vmgate/vmgate/gateway/wire"
)

// WriteStatus prints st as tables, for `vmgated status` and `vm-exec ps`;
// now is the time ages are counted to.
func WriteStatus(w io.Writer, st *wire.Status, now time.Time) error {
	whose := "yours"
	if st.All {
		whose = "all callers"
	}
	fmt.Fprintf(w, "vmgated %s: %d of %d VMs live, %d waiting; audit %s; policy %s\n", st.Version, st.LiveVMs, st.MaxVMs, st.Waiting, st.Audit, st.Policy)
	if c := st.Caller; c != nil {
		fmt.Fprintf(w, "profile %s: image %s; may name %s\n", c.Profile, c.Image, strings.Join(c.Images, ", "))
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "COMMANDS (%s)\tVM\tPROFILE\tCALLER\tSTART\tAGE\tSESSION\n", whose)
	for _, v := range st.VMs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", short(strings.Join(v.Argv, " "), 40), v.VMID, v.Profile, v.Caller,
			dash(v.VMStart), age(now.Sub(v.Started)), dash(v.Session))
	}
	fmt.Fprintf(tw, "\nSESSIONS (%s)\tVM\tPROFILE\tIMAGE\tOWNER\tIDLE\tEXPIRES IN\tBUSY\n", whose)
	for _, s := range st.Sessions {
		where := s.VMID
		if s.State == wire.SessionPaused {
			where = fmt.Sprintf("paused %s ago, %d MiB", age(now.Sub(s.PausedAt)), s.DiskBytes>>20)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\n", s.Name, where, s.Profile, dash(s.Image), s.Owner, age(now.Sub(s.LastUsed)), age(s.ExpiresAt.Sub(now)), s.Busy)
	}
	fmt.Fprintf(tw, "\nPOOLS\tIMAGE\tMEMORY\tCPUS\tDISK\tNETWORK\tREADY\tAHEAD\tHITS/MISSES\n")
	for i, p := range st.Pools {
		fmt.Fprintf(tw, "%d\t%s\t%d MiB\t%d\t%d MiB\t%v\t%d/%d\t%d/%d\t%d/%d\n", i, p.Image, p.MemoryMiB, p.CPUs, p.DiskMiB, p.Network, p.Ready, p.Size, p.Ahead, p.AheadSize, p.Hits, p.Misses)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func short(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

// age is d rounded for a person: 850ms, 12s, 3m4s, 2h5m.
func age(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}
