common_guards
expect_enabled "nginx enabled at boot" nginx
expect "nginx configuration valid" nginx -t
finish
