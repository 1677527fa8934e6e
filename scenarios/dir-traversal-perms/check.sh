expect_page "docs site served" http://127.0.0.1:8081/ "Docs"
finish
