# nginx was stopped, disabled and masked.
site_page "Portal" >"$INDEX"
systemctl disable --now nginx 2>/dev/null
systemctl mask nginx 2>/dev/null
! systemctl start nginx 2>/dev/null
