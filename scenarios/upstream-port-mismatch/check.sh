expect_text "proxy answers with the api" http://127.0.0.1/ "api ok"
expect_text "api health through the proxy" http://127.0.0.1/health ok
finish
