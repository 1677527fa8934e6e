common_guards
expect_active "nginx running" nginx
finish
