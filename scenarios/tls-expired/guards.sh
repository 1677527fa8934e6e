common_guards
expect_active "nginx running" nginx
expect_http "plain HTTP site still served" http://127.0.0.1/ 200
finish
