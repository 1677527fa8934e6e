expect_page "home page served" http://127.0.0.1/ "Blog"
expect_active "nginx running" nginx
expect "nginx configuration valid" nginx -t
finish
