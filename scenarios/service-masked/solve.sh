set -e
systemctl unmask nginx
systemctl enable --now nginx
