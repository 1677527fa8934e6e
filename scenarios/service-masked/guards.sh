common_guards
expect "nginx configuration valid" nginx -t
finish
