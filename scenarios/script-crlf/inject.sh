# The start script has CRLF line ends ("/bin/bash\r": bad interpreter)
# and lost its execute bit.
install_app reportgen 8090 /opt/reportgen/start.sh
printf '#!/bin/bash\r\n# Start the report generator.\r\ncd /opt/reportgen || exit 1\r\nexec /usr/bin/python3 /opt/reportgen/server.py 8090\r\n' >/opt/reportgen/start.sh
chmod 644 /opt/reportgen/start.sh
start_failing reportgen
