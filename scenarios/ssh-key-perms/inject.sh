# sshd's StrictModes ignores authorized_keys when the home directory or
# ~/.ssh is writable by others, as deploy's are now.
id deploy >/dev/null 2>&1 || useradd --create-home --shell /bin/bash deploy
mkdir -p /home/deploy/.ssh
echo 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIA5h6K/ui3dTRrnUUtHaupQ1roJx2cS7nUpX1tL7eDmZ deploy@ci' >/home/deploy/.ssh/authorized_keys
chown -R deploy:deploy /home/deploy/.ssh
chmod 600 /home/deploy/.ssh/authorized_keys
chmod 777 /home/deploy /home/deploy/.ssh
systemctl is-active --quiet ssh
