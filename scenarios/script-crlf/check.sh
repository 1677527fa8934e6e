expect_text "health check answers ok" http://127.0.0.1:8090/health ok
expect_active "report service running" reportgen
finish
