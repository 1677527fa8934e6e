package policy

// Grant is what a caller's profile grants, as the caller may learn it
// (GET /v1/status): no argv rule, limit or secret of the operator's
// beyond its own network.
type Grant struct {
	Profile  string
	Image    string   // the image of its commands that name none (profile.image)
	Images   []string // the images it may name (images), its image first
	Shell    bool     // shell strings (-c) allowed
	Sessions bool     // sessions allowed
	Network  bool     // its VMs have a network (network.mode = "allowlist")
	Allow    []string // that network's rules, as the policy writes them
}

// GrantOf returns what id's profile grants; ok is false when no profile
// takes id. Pure.
func (p *Policy) GrantOf(id Identity) (g Grant, ok bool) {
	if p == nil {
		return Grant{}, false
	}
	prof, _ := p.profileFor(id)
	if prof == nil {
		return Grant{}, false
	}
	g = Grant{Profile: prof.name, Image: prof.image, Images: imageNames(prof.imageList()), Shell: prof.allowShell, Sessions: prof.limits.AllowSessions, Network: prof.net != nil}
	if prof.net != nil {
		for _, r := range prof.net.Rules {
			g.Allow = append(g.Allow, r.String())
		}
	}
	return g, true
}
