expect_page "home page served on port 80" http://127.0.0.1/ "Intranet"
finish
