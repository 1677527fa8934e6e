expect_text "health check answers ok" http://127.0.0.1:8080/health ok
expect_active "inventory running" inventory
expect_enabled "inventory starts at boot" inventory
finish
