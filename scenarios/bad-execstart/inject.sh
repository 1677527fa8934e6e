# The unit's ExecStart names an interpreter that does not exist
# (/usr/bin/python; Debian 12 only has python3).
install_app inventory 8080 "/usr/bin/python /opt/inventory/server.py 8080"
start_failing inventory
