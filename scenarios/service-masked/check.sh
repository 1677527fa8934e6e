expect_page "home page served" http://127.0.0.1/ "Portal"
expect_active "nginx running" nginx
expect_enabled "nginx starts at boot" nginx
finish
